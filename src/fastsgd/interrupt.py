"""Ctrl-C on `fastsgd run` and `fastsgd simulate`: every worker stops after the same step,
writes a checkpoint and exits, within seconds; then the launcher says how to resume.

The workers ignore SIGINT (a terminal sends it to the whole process group): a worker
interrupted at a random point could not take part in a checkpoint, which is a collective.
The launcher and its forked workers share two things in memory: each worker's progress
(the steps it has done, written after every step) and the step to stop at, 0 until the
launcher sets it. On Ctrl-C the launcher sets it a little ahead of the furthest worker:
two steps, plus the steps the workers make in 100 ms, so that none has gone past it by the
time it reads it (synchronous workers are within a step of each other; asynchronous ones
wait for the slowest in the checkpoint's barrier).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_SHARED: Stop | None = None  # set in each forked worker (launch.py)


class _Value:
    value = 0


class Stop:
    """`ctx`: a multiprocessing context, shared with forked workers; None: one process (the
    simulator, whose workers are coroutines of one thread)."""

    def __init__(self, ctx: Any, workers: int):
        self.progress = ctx.Array("q", workers, lock=False) if ctx else [0] * workers
        self.stop_at = ctx.Value("q", 0, lock=False) if ctx else _Value()

    def request(self) -> int:
        """Set the step every worker stops after; returns it."""
        before = max(self.progress)
        time.sleep(0.02)
        now = max(self.progress)
        self.stop_at.value = now + 2 + 5 * (now - before)
        return self.stop_at.value


def share(stop: Stop | None) -> None:
    """In a forked worker: this is the launcher's Stop (in the simulator: the one of
    `simulated`; None: none any more)."""
    global _SHARED
    _SHARED = stop


@contextmanager
def simulated(workers: int) -> Iterator[Stop]:
    """`fastsgd simulate`: Ctrl-C sets the step every simulated worker stops after, as the
    launcher of `fastsgd run` does; the workers write a checkpoint there and end."""
    stop = Stop(None, workers)
    share(stop)
    try:
        with catching(lambda *_: _again(stop)):
            yield stop
    finally:
        share(None)


@contextmanager
def catching(handler: Any = signal.default_int_handler) -> Iterator[None]:
    """SIGINT goes to `handler` (by default: KeyboardInterrupt) while inside, in the main
    thread. Set explicitly because a process started in the background by a shell without
    job control inherits SIGINT ignored, and Python then leaves it ignored: Ctrl-C sent with
    kill would do nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _again(stop: Stop) -> None:
    """The first Ctrl-C asks to stop; a second one stops at once (no checkpoint)."""
    if stop.stop_at.value:
        raise KeyboardInterrupt
    stop.request()


def steps_done(rank: int) -> int | None:
    """How many steps worker `rank` has done, as the launcher's shared memory says (None
    outside `fastsgd run`'s own workers and `fastsgd simulate`): for a worker that died,
    where it stopped."""
    return None if _SHARED is None else int(_SHARED.progress[rank])


def stop_after(rank: int, step: int) -> bool:
    """After each step: record it, and say whether the launcher asks to stop here. Always
    False outside `fastsgd run`'s own workers and `fastsgd simulate` (under torchrun)."""
    if _SHARED is None:
        return False
    _SHARED.progress[rank] = step
    return _SHARED.stop_at.value == step
