"""Hogwild! (Niu et al. 2011): several processes on one machine update one copy of the
parameters in shared memory, without locks. Each worker's parameters become views of the
shared vector, so its optimizer step writes straight into it (its optimizer state stays its
own); sparse, rarely colliding updates make the races harmless in practice. Nothing crosses
a network: the workers must share a machine (PyTorch's multiprocessing Hogwild example).
"""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.params import flatten
from fastsgd.strategies.staleness import ADAPT_OPTION, Adjustment

Params = list[torch.nn.Parameter]


class Hogwild(StrategyBase):
    name = "hogwild"
    # run.backend = "auto" picks gloo: the parameters live in /dev/shm
    capabilities = Capabilities(host_memory=True)
    OPTIONS = {"adapt_optimizer": ADAPT_OPTION}

    def __init__(self, adapt_optimizer: bool = True):
        self.adapt_optimizer = adapt_optimizer

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        # n optimizers step one vector: it moves by the sum of their steps, where synchronous
        # SGD moves by the mean, so each optimizer's rate is cut to 1/n (staleness.py)
        if self.adapt_optimizer:
            Adjustment(lr_scale=1.0 / ctx.transport.world_size).apply(ctx.optimizer)
        shared = ctx.transport.shared_tensor("hogwild", flatten(params))
        offset = 0
        for p in params:
            p.data = shared[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        return {}

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        ctx.stats["staleness"] = 0

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def close(self) -> None:
        return None
