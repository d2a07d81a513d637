"""A worker process forked by the launcher (launch.py): how it is started, what it finds in
its environment, and how a failure of it is told (Told): its own report through the error
queue, or what its exit code says."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import signal
import traceback
from collections.abc import Callable, Sequence

import torch

from fastsgd.control.crashes import Stacks, building_model, crashed
from fastsgd.control.interrupt import DONOR_LOST, STOPS, Stop, held, share
from fastsgd.errors import UserError, WorkerFailed
from fastsgd.launch.door import GONE, GONE_FAILED

# the reports of failed workers share the error queue's pipe (64 kB): a worker whose report
# does not fit blocks in put() until the launcher reads it, which it does once the worker
# has ended: never. 4 kB each leave room for 16 workers (a RecursionError's trace is 100s).
REPORT_CHARS = 1000, 3000  # the message, the trace
PR_SET_PDEATHSIG = 1  # prctl(2)


def forked(processes: list[mp.process.BaseProcess]) -> None:
    """Start `processes` (forked) with this process's objects out of their garbage collectors'
    reach (gc.freeze, as Python's docs advise before a fork). Garbage of this process not
    yet collected, such as the TCPStore of an earlier run held in a cycle by an exception's
    traceback, was otherwise destroyed in the child, where its destructor waited forever to
    join a thread the child does not have (seen as a worker hung in its first steps)."""
    gc.collect()  # here, where the threads such objects wait for are still running
    gc.freeze()
    # a Ctrl-C that lands inside a fork is raised in an after-fork hook, where Python ignores
    # it: the run went on to its end. Held back until the forks are done, it is raised here.
    try:
        with held():
            for process in processes:
                process.start()
    finally:
        gc.unfreeze()


def worker_environment(rank: int, world: int, port: int, restart: int = 0) -> None:
    """What a worker of the launcher's finds in its environment, and one intra-op thread."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), FASTSGD_RESTART=str(restart),
                      TORCHELASTIC_USE_AGENT_STORE="True")  # the launcher's (_store)
    torch.set_num_threads(1)


def child(fn: Callable[[], object], rank: int, world: int, port: int,
           errors: mp.SimpleQueue, restart: int, stop: Stop, join: str | None = None) -> None:
    """`join`: None, or the run takes new workers in lost ones' places (run.rejoin): "",
    or "STEP:DONOR:SINCE" in such a new worker (SINCE: the step the donor's process joined at)."""
    for sig in STOPS:  # Ctrl-C, SIGTERM and SIGHUP are the launcher's (interrupt.py)
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent()
    share(stop)
    if join is not None:
        os.environ["FASTSGD_REJOIN"] = "1"  # keep the message port open for joiners
    if join:
        os.environ["FASTSGD_JOIN"] = join
    worker_environment(rank, world, port, restart)
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then exit 1
        message = f"{type(e).__name__}: {e}" if not isinstance(e, UserError) else str(e)
        errors.put((rank, message[:REPORT_CHARS[0]], isinstance(e, UserError),
                    traceback.format_exc()[-REPORT_CHARS[1]:]))
        os._exit(1)
    os._exit(0)


def die_with_parent() -> None:
    """SIGKILL this process when the launcher dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so that no worker trains on unsupervised; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher died before the call: nobody would send it
        os._exit(1)


def failure_of(rank: int, exitcode: int | None, errors: mp.SimpleQueue) -> Exception:
    """What to tell: a worker killed by a signal, else the workers' own reports (user
    errors first, then by rank), else a death without a message."""
    if exitcode in (GONE, GONE_FAILED):
        how = ("failed (its error is in its own output)" if exitcode == GONE_FAILED else
               "ended without telling how (killed?)")
        return WorkerFailed(f"worker {rank}, a process of fastsgd join, {how}", died=True)
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return WorkerFailed(f"worker {rank} was killed by signal {-exitcode} ({name})",
                            died=True)
    if exitcode == DONOR_LOST:
        return WorkerFailed(f"worker {rank}, a new process, lost the worker it was to take "
                            "its state from before it had it", died=True)
    reports = []
    while not errors.empty():
        reports.append(errors.get())
    reports.sort(key=lambda r: (not r[2], r[0]))
    if not reports:
        return WorkerFailed(f"worker {rank} died (exit code {exitcode}) without a message",
                            died=True)
    first_rank, message, is_user_error, trace = reports[0]
    if is_user_error:
        return UserError(message)
    return WorkerFailed(f"worker {first_rank} failed: {message}\n{trace}", rank=first_rank)


class Told:
    """What the launcher tells of worker `rank`'s end (`exitcode`): forking.failure_of (its
    own report, or its death), unless it crashed (control/crashes.py); a failure that is
    not a death, with the step it was in (from 1: `progress`, the launcher's count of the
    steps each worker has done, plus one), or as failed building its model (no step)."""

    def __init__(self, errors: mp.SimpleQueue, progress: Sequence[int] = (),
                 stacks: Stacks | None = None):
        self.errors, self.progress, self.stacks = errors, progress, stacks

    def __call__(self, rank: int, exitcode: int | None) -> Exception:
        if crashed(exitcode):
            failure = self._crash(rank, exitcode)
        else:
            failure = failure_of(rank, exitcode, self.errors)
        if isinstance(failure, WorkerFailed) and not failure.died and failure.rank is not None:
            if building_model(str(failure)):
                return failure.placed(" while building its model")
            failure.step = self._step(failure.rank)
        return failure

    def _crash(self, rank: int, exitcode: int) -> WorkerFailed:
        name = signal.Signals(-exitcode).name
        stack = self.stacks.read(rank) if self.stacks else ""
        return WorkerFailed(
            f"worker {rank} crashed: signal {-exitcode} ({name}) from within the code it ran, "
            "a bug (a collective whose size differs between workers, say), not a lost "
            "machine: the run is not restarted"
            + (f"\nits Python stack as it crashed:\n{stack}" if stack else ""), rank=rank)

    def _step(self, rank: int) -> int | None:
        return int(self.progress[rank]) + 1 if rank < len(self.progress) else None
