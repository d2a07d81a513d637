"""torch's DistributedDataParallel as a strategy: the baseline that fastsgd's synchronous
all-reduce is measured against, on the same work (`fastsgd bench` can put a `ddp` cell
beside the others). DDP wraps the model; its reducer all-reduces buckets of gradients while
backward runs (Li et al. 2020, "PyTorch Distributed"), so nothing is left to do after
backward. Real processes only, and no codec: it is torch's, as a user would run it.

Its bytes are counted as the ring all-reduce of every gradient each step, what DDP's
reducer sends over gloo or NCCL (2(n-1)/n of the gradient bytes per worker)."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from fastsgd.config.options import Option, positive
from fastsgd.errors import UserError
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.transport.base import ring_allreduce_bytes

Params = list[torch.nn.Parameter]


class DDP(StrategyBase):
    name = "ddp"
    capabilities = Capabilities(real_only=True)  # fastsgd simulate refuses it
    OPTIONS = {"bucket_mb": Option(float, 25.0, positive, "DDP's bucket_cap_mb")}

    def __init__(self, bucket_mb: float = 25.0):
        self.bucket_mb = bucket_mb
        self._bytes = 0

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        if not hasattr(ctx.transport, "process_group"):
            raise UserError("strategy.name = 'ddp' is torch's DistributedDataParallel: real "
                            "processes only (fastsgd run); in the simulator, allreduce is "
                            "the same algorithm")
        size = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        self._bytes = ring_allreduce_bytes(size, ctx.transport.world_size)
        return {}

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        """The module the step runs forward through: DDP's, whose backward all-reduces."""
        device = ctx.transport.device
        return DistributedDataParallel(
            model, process_group=ctx.transport.process_group(), bucket_cap_mb=self.bucket_mb,
            device_ids=[device.index] if device.type == "cuda" else None)

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        ctx.transport.count(self._bytes, self._bytes)  # DDP's reducer sent them in backward

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        pass

    def close(self) -> None:
        """DDP's reducer goes with its module; nothing of ours is running."""
