"""A strategy of your own: SPARTA, sparse parameter averaging.

Each step, after the optimizer, every worker averages the same random `fraction` of the
parameters with the others (one small all-reduce); the rest train locally. On the last step
it averages everything, so the workers end with one model. Beton, Baioumy, van der Ouderaa,
Reed, Howes, Cheema & Vrabie (EXO Labs, 2025), "SPARTA: sparse parameter averaging".

    fastsgd simulate --set strategy.name=my_strategy:Sparta --set strategy.fraction=0.05
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils import parameters_to_vector

from fastsgd import Capabilities, Context, Option, StrategyBase
from fastsgd.config.options import between

Params = list[torch.nn.Parameter]


class Sparta(StrategyBase):
    name = "sparta"  # what runs and reports call it
    OPTIONS = {"fraction": Option(float, 0.05, between(1e-6, 1.0),
                                  "share of the parameters averaged each step"),
               "seed": Option(int, 0, doc="seed of the choice of parameters")}
    # it all-reduces raw values, so only the exact codec (`none`) applies: the default
    # codec_kinds; it averages every parameter on the last step (ctx.last_step)
    capabilities = Capabilities(drains_at_end=True)

    def __init__(self, fraction: float = 0.05, seed: int = 0):
        self.fraction, self.seed = fraction, seed

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        return {}  # the indices come from the step number: nothing to checkpoint

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None  # gradients stay local

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        flat = parameters_to_vector([p.detach() for p in params])
        if ctx.last_step:
            chosen = torch.arange(flat.numel())
        else:  # the same indices on every worker: drawn from the seed and the step alone
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + ctx.step)
            count = max(1, round(self.fraction * flat.numel()))
            chosen = torch.randperm(flat.numel(), generator=generator)[:count]
        values = flat[chosen]
        ctx.transport.all_reduce(values, average=True)
        flat[chosen] = values
        with torch.no_grad():
            offset = 0
            for p in params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
