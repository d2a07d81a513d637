"""Ctrl-C on `fastsgd run`: every worker stops after the same step, writes a checkpoint and
exits, within seconds; then the launcher says how to resume.

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

import time
from typing import Any

_SHARED: Stop | None = None  # set in each forked worker (launch.py)


class Stop:
    def __init__(self, ctx: Any, workers: int):
        self.progress = ctx.Array("q", workers, lock=False)
        self.stop_at = ctx.Value("q", 0, lock=False)

    def request(self) -> int:
        """Set the step every worker stops after; returns it."""
        before = max(self.progress)
        time.sleep(0.02)
        now = max(self.progress)
        self.stop_at.value = now + 2 + 5 * (now - before)
        return self.stop_at.value


def share(stop: Stop) -> None:
    """In a forked worker: this is the launcher's Stop."""
    global _SHARED
    _SHARED = stop


def stop_after(rank: int, step: int) -> bool:
    """After each step: record it, and say whether the launcher asks to stop here. Always
    False outside `fastsgd run`'s own workers (torchrun, the simulator)."""
    if _SHARED is None:
        return False
    _SHARED.progress[rank] = step
    return _SHARED.stop_at.value == step
