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

import torch

from fastsgd.errors import UserError, WorkerFailed


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn: Callable[[], object], workers: int) -> None:
    """Run `fn()` in `workers` processes with RANK/WORLD_SIZE/MASTER_* set; wait for all."""
    if torch.cuda.is_initialized():  # a forked child cannot use the parent's CUDA context
        raise UserError("this process used CUDA before starting its workers, and forked "
                        "workers cannot use it: start them first, or use torchrun")
    ctx = mp.get_context("fork")
    errors = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, rank, workers, port, errors),
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
    while any(p.is_alive() for p in procs):
        for p in procs:
            p.join(timeout=0.05)
            if p.exitcode not in (None, 0):
                raise _failure(procs.index(p), p.exitcode, errors)
    for rank, p in enumerate(procs):
        if p.exitcode != 0:
            raise _failure(rank, p.exitcode, errors)


def _failure(rank: int, exitcode: int | None, errors: mp.SimpleQueue) -> Exception:
    reports = []
    while not errors.empty():
        reports.append(errors.get())
    reports.sort(key=lambda r: (not r[2], r[0]))  # user errors first, then by rank
    if not reports:
        if exitcode is not None and exitcode < 0:
            name = signal.Signals(-exitcode).name
            return WorkerFailed(f"worker {rank} was killed by signal {-exitcode} ({name})")
        return WorkerFailed(f"worker {rank} died (exit code {exitcode}) without a message")
    first_rank, message, is_user_error, trace = reports[0]
    if is_user_error:
        return UserError(message)
    return WorkerFailed(f"worker {first_rank} failed: {message}\n{trace}")


def _child(fn: Callable[[], object], rank: int, world: int, port: int,
           errors: mp.SimpleQueue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then exit 1
        errors.put((rank, f"{type(e).__name__}: {e}" if not isinstance(e, UserError) else str(e),
                    isinstance(e, UserError), traceback.format_exc()))
        os._exit(1)
    os._exit(0)
