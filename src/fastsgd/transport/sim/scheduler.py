"""A discrete-event loop over logical workers that run as greenlets, one at a time.

Each worker is ordinary blocking Python (the same strategy code that runs on real processes).
Every transport call is a scheduling point: the runnable worker with the earliest clock runs
next, unless an event (a message arriving, a collective completing) is due first. So when a
worker acts at virtual time t, everything that happened before t in the cluster has already
happened: the simulation is causal. The worker that stops picks the next one and switches to
it itself, and goes straight on when it is still the earliest.

Workers are greenlets on one OS thread, not OS threads: a switch costs about a microsecond
where handing over between threads cost 20-60 us, and no thread keeps its own stack and
math-library buffers (issue 10: 1024 workers on one machine). What torch keeps per thread
(grad mode) is saved and restored at every switch, as a thread of its own would keep it, and
so is what a process of its own would keep alone: torch's CPU random generator, so that a
codec's or dropout's draws are the numbers the same worker draws on a real process.

Clocks are integer nanoseconds and ties go by (time, sequence) for events and (time, rank)
for workers, so with a modeled compute time (`charge`) a run is a pure function of its
inputs. With measured compute (`wall_factor` > 0) the wall time a worker took since it was
resumed is charged too, times that factor: realistic but not reproducible.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from greenlet import getcurrent, greenlet


class SimAborted(Exception):
    """Raised inside a worker when the simulation stops because another worker failed."""


class Crashed(SimAborted):
    """Raised inside a worker when its crash (faults.py) takes effect: it ends quietly, and
    the others go on."""


@dataclass
class _Worker:
    rank: int
    wall_factor: float = 0.0  # measured compute: charge wall time times this
    clock: int = 0  # ns
    runnable: bool = True
    done: bool = False
    version: int = 0  # of its entry in the ready heap (older entries are stale)
    resumed_at: float = 0.0
    glet: Any = None  # the greenlet running it


class Scheduler:
    def __init__(self, world_size: int, wall_factors: list[float] | None = None):
        """`wall_factors`: measured compute, each worker's wall time charged times its factor
        (None: compute is charged only by `charge`)."""
        factors = wall_factors or [0.0] * world_size
        self.workers = [_Worker(r, factors[r]) for r in range(world_size)]
        self._ready = [(0, r, 0) for r in range(world_size)]  # (clock, rank, version)
        self._events: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._main: Any = None  # the greenlet of `run`, resumed when nothing more can run
        self._current: _Worker | None = None
        self._aborted = False
        self._errors: list[tuple[int, BaseException]] = []
        self._results: list[Any] = [None] * world_size
        self._grad = True

    # ---- called by workers ------------------------------------------------------------
    def now(self, rank: int) -> int:
        """Worker `rank`'s clock in ns."""
        w = self.workers[rank]
        return w.clock + self._elapsed(w) if w is self._current and w.wall_factor else w.clock

    def charge(self, rank: int, ns: int) -> None:
        """Advance the worker's clock by a modeled compute time."""
        self.workers[rank].clock += ns

    def set_wall_factor(self, rank: int, factor: float) -> None:
        """Measured compute: charge the wall time since the last scheduling point, and from
        now on, times `factor`."""
        w = self.workers[rank]
        w.wall_factor = factor
        w.clock += self._elapsed(w)
        w.resumed_at = time.perf_counter()

    def yield_(self, rank: int) -> None:
        """Scheduling point: charge the compute done so far, let earlier workers and events
        catch up. Goes straight on when nothing is due before this worker's clock."""
        w = self.workers[rank]
        if w.wall_factor:
            w.clock += self._elapsed(w)
            w.resumed_at = time.perf_counter()
        if self._due_before(w):
            self._switch(w, runnable=True)

    def block(self, rank: int) -> None:
        """Wait until an event calls `wake(rank, t)`."""
        self._switch(self.workers[rank], runnable=False)

    def off_clock(self, rank: int) -> None:
        """Forget the compute time since the last scheduling point (e.g. evaluation)."""
        self.workers[rank].resumed_at = time.perf_counter()

    # ---- called from event callbacks --------------------------------------------------------
    def at(self, when: int, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def wake(self, rank: int, when: int) -> None:
        w = self.workers[rank]
        w.clock = max(w.clock, when)
        w.runnable = True
        self._push(w)

    def spawn(self, rank: int, fn: Callable[[], Any], when: int) -> None:
        """A new worker in `rank`'s place, whose last one has ended (run.rejoin): it runs
        `fn` from virtual time `when`, and its result replaces the last one's."""
        w = self.workers[rank]
        assert w.done, f"worker {rank} is still running"
        w.done, w.runnable, w.clock = False, True, when
        w.glet = greenlet(lambda *_: self._body(w, fn, first_turn=False), self._main)
        self._push(w)

    # ---- the ready heap ----------------------------------------------------------------------
    def _push(self, w: _Worker) -> None:
        w.version += 1
        heapq.heappush(self._ready, (w.clock, w.rank, w.version))

    def _first_ready(self) -> _Worker | None:
        """The runnable worker with the earliest (clock, rank), left in the heap."""
        while self._ready:
            _, rank, version = self._ready[0]
            w = self.workers[rank]
            if version == w.version and w.runnable and not w.done:
                return w
            heapq.heappop(self._ready)
        return None

    def _due_before(self, w: _Worker) -> bool:
        """Would an event or another worker come before `w` goes on?"""
        if self._events and self._events[0][0] <= w.clock:
            return True
        other = self._first_ready()
        return other is not None and (other.clock, other.rank) < (w.clock, w.rank)

    def _next(self) -> _Worker | None:
        """Run the events due before the earliest runnable worker and take that worker off
        the heap; None when nothing can run (all done, a deadlock or an error)."""
        while not self._errors and not self._aborted:
            nxt = self._first_ready()
            if self._events and (nxt is None or self._events[0][0] <= nxt.clock):
                _, _, action = heapq.heappop(self._events)
                action()
                continue
            if nxt is not None:
                heapq.heappop(self._ready)
            return nxt
        return None

    def _resume(self, nxt: _Worker | None) -> None:
        """Hand the processor to `nxt`, or back to `run` when nothing more can run."""
        self._current = nxt
        if nxt is None:
            self._main.switch()
            return
        nxt.resumed_at = time.perf_counter()
        nxt.glet.switch()

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, fns: list[Callable[[], Any]]) -> list[Any]:
        """Run fns[r] as worker r until all finish; re-raise the first worker error."""
        self._main, self._grad = getcurrent(), torch.is_grad_enabled()
        results, grad, draws = self._results, self._grad, torch.default_generator.get_state()
        for w, fn in zip(self.workers, fns):
            w.glet = greenlet(lambda *_, w=w, fn=fn: self._body(w, fn), self._main)
            w.glet.switch()  # started from here, not deep in another worker's stack
        try:
            nxt = self._next()
            if nxt is not None:
                self._current = nxt
                nxt.resumed_at = time.perf_counter()
                nxt.glet.switch()
        finally:
            self._abort_rest()
            torch.set_grad_enabled(grad)
            torch.default_generator.set_state(draws)
        if self._errors:
            raise sorted(self._errors, key=lambda e: e[0])[0][1]
        stuck = [w.rank for w in self.workers if not w.done]
        if stuck:
            raise RuntimeError(f"simulation deadlock: workers {stuck} wait for messages "
                               "or collectives that never come")
        return results

    def _body(self, w: _Worker, fn: Callable[[], Any], first_turn: bool = True) -> None:
        """A worker's greenlet. When it ends, it hands over to the next worker by making
        that one its parent (a greenlet that ends resumes its parent). One made by `run`
        goes back to it until its first turn; one spawned later starts on its first turn."""
        try:
            if first_turn:
                self._main.switch()
            torch.set_grad_enabled(self._grad)
            self._results[w.rank] = fn()
        except Crashed:
            pass
        except SimAborted:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the caller of run()
            self._errors.append((w.rank, e))
        w.clock += self._elapsed(w)
        w.done = True
        try:
            nxt = self._next()
        except BaseException as e:  # noqa: BLE001 - an event failed: stop the simulation
            self._errors.append((-1, e))
            nxt = None
        self._current = nxt
        if nxt is not None:
            nxt.resumed_at = time.perf_counter()
            w.glet.parent = nxt.glet

    def _switch(self, w: _Worker, runnable: bool) -> None:
        if self._aborted:
            raise SimAborted()
        w.clock += self._elapsed(w)
        w.runnable = runnable
        if runnable:
            self._push(w)
        nxt = self._next()
        if nxt is w:
            w.resumed_at = time.perf_counter()
            return
        grad = torch.is_grad_enabled()  # thread-local in torch; all workers share the thread
        draws = torch.default_generator.get_state()  # process-wide: one per real worker
        self._resume(nxt)
        torch.set_grad_enabled(grad)
        torch.default_generator.set_state(draws)
        if self._aborted:
            raise SimAborted()
        w.resumed_at = time.perf_counter()

    def _elapsed(self, w: _Worker) -> int:
        if not w.wall_factor:
            return 0
        return round((time.perf_counter() - w.resumed_at) * w.wall_factor * 1e9)

    def _abort_rest(self) -> None:
        """Unwind the workers still suspended, so that their `finally` blocks run."""
        self._aborted = True
        for w in self.workers:
            if not w.done and w.glet is not None and w.glet:
                w.glet.throw(SimAborted())
