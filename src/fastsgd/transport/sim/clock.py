"""One simulated worker's clock: the compute it is charged (the compute model's times, or
the wall time), its offloaded compute (lanes.py), and the all-reduces its backward asks
for, started as backward makes their buckets. SimTransport takes these from here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastsgd.transport.sim.faults import Crashed
from fastsgd.transport.sim.lanes import Asked, LaneUser, start_points

if TYPE_CHECKING:
    import torch

    from fastsgd.transport.sim.fabric import SimFabric
    from fastsgd.transport.sim.handles import SimHandle
    from fastsgd.transport.sim.scheduler import Scheduler


class SimClock:
    """Compute and time of logical worker `rank` (SimTransport's, see transport/base.py)."""

    rank: int
    fabric: SimFabric
    scheduler: Scheduler
    lane: LaneUser
    _step: int  # the step this worker is at
    _asked: list[Asked]  # all-reduces asked in forward + backward, not started
    _backward_next: bool  # the offload in progress charged a forward
    _all_reduce: Callable[[torch.Tensor, bool, bool], SimHandle]  # SimTransport's, starts one

    def now(self) -> float:
        return self.scheduler.now(self.rank) / 1e9

    def now_ns(self) -> int:
        return self.scheduler.now(self.rank)

    def set_clock(self, ns: int) -> None:
        """Resume: this worker's clock where the checkpoint left it."""
        self.scheduler.workers[self.rank].clock = ns

    def compute(self, phase: str, step: int, share: float = 1.0) -> None:
        """Charge the compute model's time for `phase` of `step`, times `share` (compute.py;
        `_start_asked`)."""
        model, rank = self.fabric.compute, self.rank
        now = self.scheduler.now(rank)
        self._step = step
        self._backward_next |= phase == "forward"
        if phase == "update" and self.fabric.membership.crash_due(rank, now, step):
            self.fabric.crash(rank, step)  # after its optimizer step, before it exchanges
            raise Crashed()
        if not model.deterministic:
            self.scheduler.set_wall_factor(rank, model.factor(rank, step, now))
            return
        start = model.available_ns(rank, now)
        self.scheduler.charge(rank, start - now)
        ns = model.phase_ns(phase, rank, step, start)
        ns = ns if share == 1.0 else round(ns * share)
        self.scheduler.charge(rank, ns - (self._start_asked(ns) if phase == "backward" else 0))
        if phase == "update":  # once a step: workers that never talk (hogwild) interleave
            self.scheduler.yield_(rank)

    def _start_asked(self, backward: int = 0) -> int:
        """Start the all-reduces asked in forward + backward, in order, each once the part of
        the `backward` ns that made its tensor is charged (lanes.start_points); the ns charged.
        Hooks run with the clock at the forward's end (or on a lane): started there, buckets
        reached the network before backward had made them."""
        asked, self._asked = self._asked, []
        charged = 0
        for (tensor, average, deferred), point in zip(asked, start_points(asked, backward)):
            self.scheduler.charge(self.rank, point - charged)
            charged = point
            deferred.handle = self._all_reduce(tensor, True, average)
        return charged

    def offload(self, work: Callable[[Callable[[], None]], Any],
                charge: Callable[[], None]) -> Any:
        """`work(charged)`: compute that calls `charged()` once, after its part that `charge`
        prices (the forward of forward + backward; the whole optimizer step); its result.
        The worker then sleeps until its clock, so that the others run meanwhile; with
        compute lanes (lanes.py) `work` runs on one. With modeled compute the async
        all-reduces `work` asks for (backward hooks') are recorded, lanes or not, and
        `compute("backward")` starts them (at once if no forward was charged: no backward
        follows); measured compute starts them when asked, at the wall-clock point."""
        asked: list[Asked] | None = [] if self.fabric.compute.deterministic else None
        self._backward_next = False
        result = self.lane.offload(work, charge, lambda: self.scheduler.yield_(self.rank),
                                   asked)
        self._asked += asked or []
        if not self._backward_next:  # no backward follows (an update)
            self._start_asked()
        return result

    def defer(self, work: Callable[[], None]) -> None:
        """On a compute lane if there are lanes, done before this worker's next offloaded
        compute or `await_deferred()` (lanes.py); else now."""
        self.lane.defer(work)

    def await_deferred(self) -> None:
        self.lane.await_deferred()

    def off_clock(self) -> None:
        """Do not charge the time since the last transport call (evaluation, logging)."""
        self.scheduler.off_clock(self.rank)
