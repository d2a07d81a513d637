"""Start N local worker processes joined by torch.distributed on loopback.

Workers are forked, so a Job built from lambdas and local functions needs no pickling. Each
runs torch with one intra-op thread, as torchrun does by default (OMP_NUM_THREADS=1): a
forked child that starts an OpenMP pool of its own after the parent used one hangs (libgomp
is not fork-safe). If one worker fails, the others are stopped and its message is raised.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import traceback
from collections.abc import Callable
from multiprocessing import connection

import torch

from fastsgd.errors import UserError, WorkerFailed


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn: Callable[[], object], workers: int, restart: int = 0) -> None:
    """Run `fn()` in `workers` processes with RANK/WORLD_SIZE/MASTER_* set (and
    FASTSGD_RESTART, how many times the run was restarted); wait for all. The first worker
    that fails stops the others at once."""
    if torch.cuda.is_initialized():  # a forked child cannot use the parent's CUDA context
        raise UserError("this process used CUDA before starting its workers, and forked "
                        "workers cannot use it: start them first, or use torchrun")
    ctx = mp.get_context("fork")
    errors = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, rank, workers, port, errors, restart),
                         name=f"fastsgd-worker-{rank}") for rank in range(workers)]
    for p in procs:
        p.start()
    try:
        _wait(procs, errors)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()


def _wait(procs: list[mp.process.BaseProcess], errors: mp.SimpleQueue) -> None:
    """Until all have ended; a failure is seen the moment its process ends."""
    running = list(procs)
    while running:
        for sentinel in connection.wait([p.sentinel for p in running]):
            p = next(p for p in running if p.sentinel == sentinel)
            p.join()
            running.remove(p)
            if p.exitcode != 0:
                # a worker that vanished (a signal) is the cause; its peers' connection
                # errors, which may come first, are the consequence
                dead = [q for q in procs if q.exitcode is not None and q.exitcode < 0]
                first = dead[0] if dead else p
                raise _failure(procs.index(first), first.exitcode, errors)


def _failure(rank: int, exitcode: int | None, errors: mp.SimpleQueue) -> Exception:
    """What to tell: a worker killed by a signal, else the workers' own reports (user
    errors first, then by rank), else a death without a message."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return WorkerFailed(f"worker {rank} was killed by signal {-exitcode} ({name})",
                            died=True)
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
    return WorkerFailed(f"worker {first_rank} failed: {message}\n{trace}")


def _child(fn: Callable[[], object], rank: int, world: int, port: int,
           errors: mp.SimpleQueue, restart: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), FASTSGD_RESTART=str(restart))
    torch.set_num_threads(1)
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then exit 1
        errors.put((rank, f"{type(e).__name__}: {e}" if not isinstance(e, UserError) else str(e),
                    isinstance(e, UserError), traceback.format_exc()))
        os._exit(1)
    os._exit(0)
