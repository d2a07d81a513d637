"""The handles a simulated worker waits on: a collective in flight (SimHandle) and a posted
message crossing the sender's uplink (LeftUplink)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from fastsgd.transport.sim.collective import Collective

if TYPE_CHECKING:
    from fastsgd.transport.sim.scheduler import Scheduler


class Waiter(Protocol):
    """What a handle needs of the worker's transport (SimTransport): who waits, on which
    scheduler, among how many members."""

    rank: int
    scheduler: Scheduler

    def members(self) -> list[int]: ...


class SimHandle:
    """A simulated collective in flight. `released`: the output tensor's storage was given
    up when the worker arrived (`sole_user`); `wait` hands it a new one with the result."""

    def __init__(self, transport: Waiter, op: Collective, out: torch.Tensor | None,
                 released: bool = False, average: bool = False):
        self._transport, self._op, self._out = transport, op, out
        self._released, self._average = released, average

    def wait(self) -> None:
        t = self._transport  # no yield first: blocking runs what is due, then wakes us
        if self._op.end is None:
            self._op.waiting.add(t.rank)
            t.scheduler.block(t.rank)
        if self._out is None:
            return
        result = self._op.result
        if self._average:  # divided as it is handed back: one pass over it, not two
            n = len(t.members())
            if self._released:
                self._out.set_(torch.div(result, n))
            else:
                torch.div(result, n, out=self._out)
        elif self._released:  # the result is shaped as what the worker brought
            self._out.set_(result.clone())
        else:
            self._out.copy_(result)
        self._out = None


_use_count = getattr(torch._C, "_storage_Use_Count", None)


def sole_user(tensor: torch.Tensor) -> bool:
    """Whether `tensor` may give up its storage while its all-reduce is in flight: nothing
    else uses it (no view, no other tensor: those must see the result in place). What a
    worker brings is folded in on arrival and its contents are undefined until wait(), as on
    real processes. A buffer that each of hundreds of simulated workers held through the
    wait has left the cache when the result is copied into it; given up, it is folded in
    without a copy, and the next worker's buffers reuse its memory while it is still in the
    cache (docs/simulator.md, "Scale and speed")."""
    if _use_count is None or tensor.requires_grad or tensor.numel() == 0:
        return False
    return _use_count(tensor.untyped_storage()._cdata) == 2  # the tensor, the query's own


class LeftUplink:
    """A posted message's handle: `wait()` returns once it is past the sender's uplink (the
    worker waits as a blocking send would, without computing)."""

    def __init__(self, transport: Waiter, left: int):
        self._transport, self._left = transport, left

    def wait(self) -> None:
        t = self._transport
        behind = self._left - t.scheduler.now(t.rank)
        if behind > 0:
            t.scheduler.charge(t.rank, behind)
            t.scheduler.yield_(t.rank)
