"""A discrete-event loop over logical workers that run as threads, one at a time.

Each worker is ordinary blocking Python (the same strategy code that runs on real processes).
Every transport call is a scheduling point: the worker's virtual clock advances by the
compute time it measured since it was last resumed, then it hands control back. The
scheduler always resumes the runnable worker with the earliest clock, unless an event
(a message arriving, a collective completing) is due first. So when a worker acts at
virtual time t, everything that happened before t in the cluster has already happened:
the simulation is causal, and for a given order of clocks, deterministic.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class SimAborted(Exception):
    """Raised inside a worker thread when the simulation stops because another worker failed."""


@dataclass
class _Worker:
    rank: int
    slowdown: float = 1.0
    clock: float = 0.0
    runnable: bool = True
    done: bool = False
    resumed_at: float = 0.0
    resume: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))


class Scheduler:
    def __init__(self, world_size: int, slowdown: dict[int, float] | None = None):
        slowdown = slowdown or {}
        self.workers = [_Worker(r, slowdown.get(r, 1.0)) for r in range(world_size)]
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._back = threading.Semaphore(0)
        self._current: _Worker | None = None
        self._aborted = False
        self._errors: list[tuple[int, BaseException]] = []

    # ---- called by worker threads -------------------------------------------------------
    def now(self, rank: int) -> float:
        w = self.workers[rank]
        return w.clock + self._elapsed(w) if w is self._current else w.clock

    def yield_(self, rank: int) -> None:
        """Scheduling point: charge the compute done so far, let earlier workers catch up."""
        self._switch(self.workers[rank], runnable=True)

    def block(self, rank: int) -> None:
        """Wait until an event calls `wake(rank, t)`."""
        self._switch(self.workers[rank], runnable=False)

    def off_clock(self, rank: int) -> None:
        """Forget the compute time since the last scheduling point (e.g. evaluation)."""
        self.workers[rank].resumed_at = time.perf_counter()

    # ---- called from event callbacks (scheduler thread) -----------------------------------
    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def wake(self, rank: int, when: float) -> None:
        w = self.workers[rank]
        w.clock = max(w.clock, when)
        w.runnable = True

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, fns: list[Callable[[], Any]]) -> list[Any]:
        """Run fns[r] as worker r until all finish; re-raise the first worker error."""
        results: list[Any] = [None] * len(fns)
        threads = [threading.Thread(target=self._body, args=(w, fn, results), daemon=True,
                                    name=f"sim-worker-{w.rank}")
                   for w, fn in zip(self.workers, fns)]
        for t in threads:
            t.start()
        try:
            self._loop()
        finally:
            self._abort_rest()
            for t in threads:
                t.join(timeout=10)
        if self._errors:
            raise sorted(self._errors, key=lambda e: e[0])[0][1]
        return results

    def _loop(self) -> None:
        while not self._errors:
            ready = [w for w in self.workers if w.runnable and not w.done]
            if not ready and not self._events:
                if all(w.done for w in self.workers):
                    return
                stuck = [w.rank for w in self.workers if not w.done]
                raise RuntimeError(f"simulation deadlock: workers {stuck} wait for messages "
                                   "or collectives that never come")
            nxt = min(ready, key=lambda w: (w.clock, w.rank)) if ready else None
            if self._events and (nxt is None or self._events[0][0] <= nxt.clock):
                _, _, action = heapq.heappop(self._events)
                action()
                continue
            self._current = nxt
            nxt.resumed_at = time.perf_counter()
            nxt.resume.release()
            self._back.acquire()
            self._current = None

    def _body(self, w: _Worker, fn: Callable[[], Any], results: list[Any]) -> None:
        w.resume.acquire()
        try:
            if not self._aborted:
                results[w.rank] = fn()
        except SimAborted:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the caller of run()
            self._errors.append((w.rank, e))
        finally:
            w.clock += self._elapsed(w)
            w.done = True
            self._back.release()

    def _switch(self, w: _Worker, runnable: bool) -> None:
        w.clock += self._elapsed(w)
        w.runnable = runnable
        self._back.release()
        w.resume.acquire()
        if self._aborted:
            raise SimAborted()
        w.resumed_at = time.perf_counter()

    def _elapsed(self, w: _Worker) -> float:
        return (time.perf_counter() - w.resumed_at) * w.slowdown

    def _abort_rest(self) -> None:
        self._aborted = True
        for w in self.workers:
            if not w.done:
                w.resume.release()
