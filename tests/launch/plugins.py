"""Strategies with a bug of their own, for the tests of how a plugin's failure is told."""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.config.options import Option

Params = list[torch.nn.Parameter]
Context = Any  # fastsgd's strategy Context: the transport, the step


class Mismatched:
    """All-reduces a tensor whose size depends on the rank (`size` + `per_rank` * rank
    elements) from step `from_step` (from 0) on: the workers' collectives disagree, as a
    plugin's bug would make them. On gloo, a peer's message longer than expected aborts the
    process that receives it (SIGABRT: "Received data size doesn't match expected size");
    one shorter than expected is taken, and the workers' collectives fall out of step."""

    name = "mismatched"
    OPTIONS = {"from_step": Option(int, 0, doc="the first step (from 0) that disagrees"),
               "size": Option(int, 1000, doc="elements all-reduced by worker 0"),
               "per_rank": Option(int, 1000, doc="elements more for each rank")}
    CODEC_KINDS = ("exact",)

    OPTIONS = {"from_step": Option(int, 0), "size": Option(int, 1000),
               "per_rank": Option(int, 1000)}

    def __init__(self, from_step: int = 0, size: int = 1000, per_rank: int = 1000):
        self.from_step, self.size, self.per_rank = from_step, size, per_rank

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        return {}

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if ctx.step >= self.from_step:
            ctx.transport.all_reduce(torch.zeros(self.size + self.per_rank * ctx.transport.rank))

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def close(self) -> None:
        return None


class Raising(Mismatched):
    """Raises inside its collective on worker `rank` from step `from_step` on, as gloo does
    when a peer is gone or a collective times out; the others all-reduce 1000 elements."""

    name = "raising"
    OPTIONS = {"from_step": Option(int, 0, doc="the first step (from 0) that raises"),
               "rank": Option(int, 1, doc="the worker that raises")}

    OPTIONS = {"from_step": Option(int, 0), "rank": Option(int, 1)}

    def __init__(self, from_step: int = 0, rank: int = 1):
        super().__init__(from_step, 1000, 0)
        self.rank = rank

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if ctx.step >= self.from_step and ctx.transport.rank == self.rank:
            raise RuntimeError("the plugin's collective failed")
        ctx.transport.all_reduce(torch.zeros(self.size))
