"""Stale-synchronous parallel (SSP; Ho et al. 2013, Petuum) with staleness bound `s`.

A worker applies its own gradient at once and the others' gradients of step t at step t+s:
the all-reduce of step t runs in the background while the worker computes s more steps, and
is only waited for then. So no worker gets more than s steps ahead of the slowest, and every
worker sees all updates older than s steps plus all of its own: SSP's guarantee. `s = 0` is
synchronous all-reduce. On the last step everything still in flight is applied, so with plain
SGD all replicas end identical (Statement 1 of Viviani et al. 2019).
On the wire: one all-reduce of all gradients per step, as for `allreduce`. With a lossy
codec that all-reduce is the codec's compressed collective, which does not run in the
background: the peers' gradients are still applied s steps late, but nobody computes
while it runs.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from fastsgd.compress.base import KINDS
from fastsgd.compress.collectives import all_reduce_mean, init_all_reduce
from fastsgd.config.options import Option, at_least
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.staleness import ADAPT_OPTION, Adjustment
from fastsgd.transport.base import Done, Handle

Params = list[torch.nn.Parameter]


class StaleSynchronous(StrategyBase):
    name = "ssp"
    # drains: applies every all-reduce still in flight (ctx.last_step)
    # the drain waits for the slowest's last steps (async_drain: not charged to the rate)
    capabilities = Capabilities(codec_kinds=KINDS, drains_at_end=True, async_drain=True)
    OPTIONS = {"staleness": Option(int, 2, at_least(0), "steps a peer's gradient may lag"),
               "adapt_optimizer": ADAPT_OPTION}

    def __init__(self, staleness: int = 2, adapt_optimizer: bool = True):
        self.staleness, self.adapt_optimizer = staleness, adapt_optimizer
        self._in_flight: deque[tuple[int, torch.Tensor, torch.Tensor, Handle]] = deque()

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        self._in_flight.clear()
        if self.adapt_optimizer:  # the momentum that the delay brings (staleness.py)
            Adjustment(staleness=self.mean_staleness(ctx.transport.world_size)).apply(
                ctx.optimizer)
        if ctx.compressor.kind == "exact":
            return {}
        like = torch.cat([p.detach().reshape(-1) for p in params if p.requires_grad])
        return {"codec": init_all_reduce(ctx.compressor, like, ctx.transport.world_size)}

    def mean_staleness(self, world_size: int) -> float:
        """The mean age of the gradient applied: a worker's own 1/n of it is fresh, the
        peers' (n - 1)/n is `staleness` steps old."""
        return self.staleness * (world_size - 1) / world_size

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        trainable = [p for p in params if p.requires_grad]
        own = torch.cat([_grad(p).reshape(-1) for p in trainable])
        n = ctx.transport.world_size
        if "codec" in state:
            total = n * all_reduce_mean(own, ctx.compressor, state["codec"], ctx.transport)
            handle: Handle = Done()
        else:
            total = own.clone()
            handle = ctx.transport.all_reduce(total, async_op=True)
        self._in_flight.append((ctx.step, total, own, handle))
        update = own / n
        keep = 0 if ctx.last_step else self.staleness
        ctx.stats["staleness"] = 0
        while len(self._in_flight) > keep:
            step, total_t, own_t, handle = self._in_flight.popleft()
            handle.wait()
            update += (total_t - own_t) / n
            ctx.stats["staleness"] = max(ctx.stats["staleness"], ctx.step - step)
        offset = 0
        for p in trainable:
            p.grad = update[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def in_flight_state(self) -> list[list[Any]]:
        """For a checkpoint: the all-reduces still held back, waited for."""
        for *_, handle in self._in_flight:
            handle.wait()
        return [[step, total, own] for step, total, own, _ in self._in_flight]

    def load_in_flight(self, saved: list[list[Any]]) -> None:
        self._in_flight = deque((step, total, own, Done()) for step, total, own in saved)

    def close(self) -> None:
        self._in_flight.clear()


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)
