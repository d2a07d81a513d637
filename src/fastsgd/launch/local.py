"""Start N local worker processes joined by torch.distributed on loopback.

Workers are forked, so a Job built from lambdas and local functions needs no pickling. Each
runs torch with one intra-op thread, as torchrun does by default (OMP_NUM_THREADS=1): a
forked child that starts an OpenMP pool of its own after the parent used one hangs (libgomp
is not fork-safe). If one worker fails, the others are stopped and its message is raised,
unless it was killed and the others carry on without it (`expendable`); not one that
crashed from within (SIGABRT, SIGSEGV: control/crashes.py), a bug. The launcher holds
the rendezvous store (as torchrun's agent does), so that it outlives any worker: survivors
that shrink form their new group through it (transport/shrink.py).
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing import connection

import torch
import torch.distributed as dist

from fastsgd.control.crashes import Stacks, crashed
from fastsgd.control.interrupt import DONOR_LOST, Stop, catching
from fastsgd.errors import Interrupted, UserError, WorkerFailed
from fastsgd.launch.door import EVERY, Door
from fastsgd.launch.forking import Told, child, forked

STOP_WITHIN = 4.5  # seconds the workers have to stop on Ctrl-C


def rendezvous_socket() -> socket.socket:
    """The store's listening socket, bound before the workers are forked: a port chosen
    then bound later could be given in between to another process's port-0 socket (two
    jobs launched at once: one's store failed with EADDRINUSE while the other's workers
    connected to its message port)."""
    try:
        return socket.create_server(("127.0.0.1", 0))
    except OSError as e:
        raise UserError(f"cannot serve the workers' rendezvous on 127.0.0.1: {e}") from None


def launch(fn: Callable[[], object], workers: int, restart: int = 0,
           expendable: int | None = None, survivors_stop: bool = False,
           rejoin: int | None = None, door: Door | None = None) -> None:
    """Run `fn()` in `workers` processes with RANK/WORLD_SIZE/MASTER_* set (and
    FASTSGD_RESTART, how many times the run was restarted); wait for all. The first worker
    that fails stops the others at once, except a worker of rank `expendable` or above
    killed by a signal: the others carry on without it (one line says so), or, with
    `survivors_stop`, write a checkpoint and stop (WorkerFailed once they have ended).
    With `rejoin` (the run's steps), a new process takes its place and joins the others
    at a step they agree on, from a live worker's state (FASTSGD_JOIN=STEP:DONOR:SINCE).
    With `door`, a process started from outside (fastsgd join) takes a lost worker's place
    the same way (door.py). WorkerFailed too if every worker was lost; for one that raised
    or crashed (control/crashes.py), with its `rank` and `step`, and not `died`."""
    if torch.cuda.is_initialized():  # a forked child cannot use the parent's CUDA context
        raise UserError("this process used CUDA before starting its workers, and forked "
                        "workers cannot use it: start them first, or use torchrun")
    _preload()
    ctx = mp.get_context("fork")
    errors = ctx.SimpleQueue()
    listening = rendezvous_socket()
    port = listening.getsockname()[1]
    stop = Stop(ctx, workers, door.path if door else None)
    stacks = Stacks(workers)
    fn = stacks.armed(fn)
    join = "" if rejoin is not None or door else None  # "": the workers accept joiners
    procs = [ctx.Process(target=child, args=(fn, rank, workers, port, errors, restart, stop,
                                              join), name=f"fastsgd-worker-{rank}")
             for rank in range(workers)]
    with catching():
        try:
            forked(procs)  # inside: a Ctrl-C while they start still stops the ones started
            store = _store(listening, workers)  # noqa: F841 - held until the workers ended
            steps = rejoin if rejoin is not None else door.steps if door else None
            joins = None if steps is None else _Rejoin(
                ctx, fn, workers, port, errors, restart, stop, steps)
            if door and joins:
                door.open(stop, port, joins.join_step)
            _wait(procs, Told(errors, stop.progress, stacks), expendable, survivors_stop,
                  stop.ready, joins if rejoin is not None else None, door)
        except KeyboardInterrupt:
            _stop(procs, stop)
        finally:
            listening.close()  # a no-op once the store owns it
            if door:
                door.close()
            _end(procs)
            stacks.close()


def _preload() -> None:
    """Import here, once, what every worker would import for itself: a torch optimizer's
    constructor imports torch._dynamo (about 1.5 s of CPU), and N forked workers share
    the parent's copy instead of paying N times on the same cores."""
    import torch._dynamo  # noqa: F401


def _store(listening: socket.socket, workers: int) -> dist.TCPStore:
    """The rendezvous store, served by this process on `listening`; started after the
    workers are forked (its server thread is not forked with them), who wait for it as
    clients, queued on the socket meanwhile. The store owns the socket from then on."""
    port = listening.getsockname()[1]
    try:
        store = dist.TCPStore("127.0.0.1", port, workers, is_master=True,
                              wait_for_workers=False, timeout=timedelta(seconds=60),
                              master_listen_fd=listening.fileno())
    except dist.DistNetworkError as e:
        raise UserError(f"cannot serve the workers' rendezvous on 127.0.0.1:{port}: "
                        f"{str(e).splitlines()[0]}") from None
    listening.detach()  # the store closes it when it ends
    return store


def _end(procs: list[mp.process.BaseProcess]) -> None:
    """No worker outlives the launcher (the interpreter would otherwise wait for it at
    exit): SIGKILL, since the workers ignore SIGTERM, which is the launcher's (interrupt.py)."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        if p.pid is not None:  # else never started
            p.join()


def _wait(procs: list[mp.process.BaseProcess], told: Told,
          expendable: int | None, survivors_stop: bool = False,
          ready: Sequence[int] = (), rejoin: _Rejoin | None = None,
          door: Door | None = None) -> None:
    """Until all have ended; a failure is seen the moment its process ends. A death before
    every worker was `ready` (connected to all its peers) stops them all: its peers may be
    waiting for it in the rendezvous, where they would learn of it only at run.timeout.
    With `rejoin`, a lost worker's place is taken by a new process (procs is updated); one
    that dies before it connected stops them all too (its peers wait for it). With `door`,
    a process from outside takes a lost worker's place when it asks (door.py)."""
    running, lost, formed = list(procs), set(), False
    while running:
        if door:
            _let_in(door, procs, running, lost)
        for p in _ended(running, connection.wait([p.sentinel for p in running], door and EVERY)):
            running.remove(p)
            rank = procs.index(p)
            # the group formed once one worker was ready: it had passed the start-up barrier,
            # which every other had entered (all(ready) missed a worker that had not yet set
            # its flag); a new worker that joins later is ready once connected to its peers
            formed = formed or not ready or any(ready)
            if (_lost(p.exitcode) and expendable is not None and rank >= expendable
                    and formed and (not ready or ready[rank])):
                lost.add(rank)
                if survivors_stop or len(lost) == len(procs):
                    continue
                _replace(rank, told(rank, p.exitcode), procs, running, lost, rejoin)
            elif p.exitcode != 0:
                raise _cause(p, procs, lost, told)
    if lost and (survivors_stop or len(lost) == len(procs)):
        failure = told(min(lost), procs[min(lost)].exitcode)
        then = ("" if len(lost) == len(procs) else
                '; the survivors wrote a checkpoint and stopped (run.on_failure = "stop")')
        raise WorkerFailed(f"{failure}{then}", died=True)


def _lost(exitcode: int) -> bool:
    """A process lost (killed by a signal, or a joiner whose donor was lost), which the
    others may go on without; not one that crashed from within (a bug)."""
    return (exitcode < 0 and not crashed(exitcode)) or exitcode == DONOR_LOST


def _replace(rank: int, failure: Exception, procs: list, running: list, lost: set[int],
             rejoin: _Rejoin | None) -> None:
    """Lost `rank`: a new worker takes its place (`rejoin`), or the others carry on."""
    joiner = rejoin.start(rank, [procs.index(q) for q in running]) if rejoin else None
    if joiner is not None:
        procs[rank] = joiner
        running.append(joiner)
        lost.discard(rank)
        print(f"fastsgd: {failure}; a new worker takes its place from step "
              f"{rejoin.stop.joined_at[rank]}, with worker "
              f"{rejoin.stop.donor[rank]}'s state", file=sys.stderr, flush=True)
    else:
        print(f"fastsgd: {failure}; the others carry on without it",
              file=sys.stderr, flush=True)


def _cause(p: mp.process.BaseProcess, procs: list, lost: set[int], told: Told) -> Exception:
    """What ends the run now that `p` failed: a worker that a signal ended (vanished, or
    crashed) is the cause; its peers' connection errors, which may come first, are the
    consequence. None such, after a loss: the survivors could not go on (a fault)."""
    dead = [q for q in procs if q.exitcode is not None and q.exitcode < 0
            and procs.index(q) not in lost]
    if not dead and lost:
        return WorkerFailed(f"{told(min(lost), procs[min(lost)].exitcode)}"
                            "; the others could not go on without it", died=True)
    first = dead[0] if dead else p
    return told(procs.index(first), first.exitcode)


def _let_in(door: Door, procs: list, running: list, lost: set[int]) -> None:
    """The process at the door, if any, takes the lowest vacant rank's place."""
    outside = door.admit(sorted(lost), [procs.index(q) for q in running])
    if outside is not None:
        procs[outside.rank] = outside
        running.append(outside)
        lost.discard(outside.rank)
        print(f"fastsgd: process {outside.pid} (fastsgd join) takes worker {outside.rank}'s "
              f"place from step {door.stop.joined_at[outside.rank]}, with worker "
              f"{door.stop.donor[outside.rank]}'s state", file=sys.stderr, flush=True)


class _Rejoin:
    """Starts a new worker process in place of a lost one (`launch`'s `rejoin`), and sets
    the join step of one from outside (fastsgd join)."""

    def __init__(self, ctx, fn: Callable[[], object], workers: int, port: int,
                 errors: mp.SimpleQueue, restart: int, stop: Stop, steps: int):
        self.ctx, self.fn, self.workers, self.port = ctx, fn, workers, port
        self.errors, self.restart, self.stop, self.steps = errors, restart, stop, steps

    def start(self, rank: int, running: list[int]) -> mp.process.BaseProcess | None:
        """The new process for lost `rank`, joining from the state of the lowest running
        worker that has one (not another joiner still waiting for its own);
        None when there is none, or the run ends before it could join."""
        step = self.join_step(rank, running)
        if step is None:
            return None
        donor = self.stop.donor[rank]
        joiner = self.ctx.Process(target=child, args=(
            self.fn, rank, self.workers, self.port, self.errors, self.restart, self.stop,
            f"{step}:{donor}:{self.stop.joined_at[donor]}"), name=f"fastsgd-worker-{rank}")
        forked([joiner])
        return joiner

    def join_step(self, rank: int, running: list[int]) -> int | None:
        """Set the step a new process in `rank` joins at, from the state of the lowest
        running worker that has one (Stop.donor); None: no one to take it from, or the run
        ends first."""
        if not running:
            return None
        donor = min([r for r in running if self.stop.settled(r)] or running)
        return self.stop.rejoin(rank, donor, self.steps)


def _stop(procs: list[mp.process.BaseProcess], stop: Stop) -> None:
    """Ctrl-C (interrupt.py): every worker stops after the same step and writes a checkpoint;
    whoever has not ended within STOP_WITHIN seconds is killed (a second Ctrl-C: at once)."""
    step = stop.request()
    deadline = time.monotonic() + STOP_WITHIN
    started = [p for p in procs if p.pid is not None]  # a Ctrl-C may come while they start
    running = [p for p in started if p.is_alive()]
    asked = list(running)  # not those lost before (a shrink): the others went on without them
    try:
        while running and time.monotonic() < deadline:
            ended = connection.wait([p.sentinel for p in running], deadline - time.monotonic())
            running = [p for p in running if p.sentinel not in ended]
    except KeyboardInterrupt:
        pass
    for p in started:
        p.join(timeout=0 if running else None)
    clean = (len(started) == len(procs) and bool(asked) and not running
             and all(p.exitcode == 0 for p in asked))
    raise Interrupted(step=step if clean else None)


def _ended(running: list[mp.process.BaseProcess], sentinels: list) -> list[mp.process.BaseProcess]:
    """The processes whose `sentinels` are ready, reaped; those a signal ended first: a loss
    is the cause of its peers' errors, and the launcher may see both in one look."""
    ended = [p for p in running if p.sentinel in sentinels]
    for p in ended:
        p.join()
    return sorted(ended, key=lambda p: not (p.exitcode < 0 or p.exitcode == DONOR_LOST))


