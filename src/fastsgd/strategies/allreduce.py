"""Synchronous all-reduce of gradients: large mini-batch SGD over N workers.

Gradients are packed into buckets (in reverse parameter order, the order backward produces
them) and each bucket's all-reduce starts as soon as its last gradient is accumulated, so
communication overlaps the rest of the backward pass (Goyal et al. 2017; PyTorch DDP, Li et
al. 2020). Averaging the workers' mean gradients gives the gradient of the mean loss over
the concatenated global batch, hence N workers with batch b equal 1 worker with batch N*b.

On the wire: one all-reduce of every gradient per step, 2(n-1)/n of the bucket bytes sent by
each worker (ring algorithm). With a lossy codec each parameter tensor is reduced in its
compressed form (compress/collectives.py): compressing layer by layer keeps a codec's scales
per layer (Karimireddy et al. 2019); the codec state is in the strategy state. What is
compressed is the gradient, after backward, or, with momentum correction (on by default when
the optimizer has momentum; correction.py), the change each worker's own optimizer step made,
after the step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fastsgd.compress.base import KINDS
from fastsgd.compress.collectives import all_reduce_means, init_all_reduce, unsent
from fastsgd.config.options import Option, one_of, positive
from fastsgd.errors import UserError
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.correction import MODES, corrects
from fastsgd.strategies.params import all_finite
from fastsgd.transport.base import Handle


class _Bucket:
    """Consecutive parameters whose gradients are all-reduced as one flat tensor. The tensor
    is made at each step, from the gradients, and dropped after it: the parameters'
    gradients become its views, freed with them. Held across steps it would be a model-sized
    buffer more per worker, and in a simulated cluster of hundreds of workers one that has
    left the cache by the time it is used again (docs/simulator.md, "Scale and speed")."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.sizes = [p.numel() for p in params]
        self.flat: torch.Tensor | None = None  # while its all-reduce is in flight
        self.pending = len(params)
        self.handle: Handle | None = None

    def like(self) -> torch.Tensor:
        """A tensor of the bucket's size and kind (what codec state is shaped after): its
        parameter's shape where it holds one (PowerSGD factors a layer's own matrix)."""
        p = self.params[0]
        if len(self.params) == 1:
            return torch.zeros_like(p, memory_format=torch.contiguous_format)
        return torch.zeros(sum(self.sizes), dtype=p.dtype, device=p.device)

    def gather_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def gather_grads(self) -> torch.Tensor:
        """A new flat tensor of the gradients (zeros for a parameter that has none)."""
        return torch.cat([p.grad.detach().reshape(-1) if p.grad is not None else
                          torch.zeros(n, dtype=p.dtype, device=p.device)
                          for p, n in zip(self.params, self.sizes)])

    def set_grads(self, flat: torch.Tensor) -> None:
        """Each parameter's gradient becomes its view of `flat` (no copy)."""
        for p, view in zip(self.params, flat.split(self.sizes)):
            p.grad = view.view_as(p)

    def launch(self, ctx: Context) -> None:
        self.flat = self.gather_grads()
        self.handle = ctx.transport.all_reduce(self.flat, async_op=True, average=True)

    def finish(self) -> torch.Tensor:
        """The mean gradient (over the survivors, once one is lost), once the all-reduce is
        done; the gradients are its views."""
        assert self.handle is not None and self.flat is not None
        self.handle.wait()
        mean = self.flat
        self.set_grads(mean)
        self.flat, self.handle, self.pending = None, None, len(self.params)
        return mean


SECOND_BACKWARD = ("a second backward before sync_gradients: allreduce sent the first one's "
                   "gradients during it (strategy.overlap); accumulate micro-batches under "
                   "`with replica.no_sync():` (all but the last), as with torch's DDP")


class AllReduce(StrategyBase):
    name = "allreduce"
    capabilities = Capabilities(
        codec_kinds=KINDS,
        carries_on=("exact",),  # shrinks: the survivors' all-reduce, the data re-sharded
        shrinks_real=True)  # also on real processes (gloo): recovery.py
    OPTIONS = {
        "bucket_mb": Option(float, 25.0, positive, "gradient bucket size in MB"),
        "overlap": Option(bool, True, doc="start each bucket's all-reduce during backward"),
        "momentum_correction": Option(str, "auto", one_of(MODES), "a lossy codec carries the "
                                      "optimizer's update, not the gradient (auto: if it has "
                                      "momentum)"),
        "keep_residual": Option(bool, True, doc="under momentum correction, each worker's "
                                "parameters keep what its codec has not sent yet (CSER)"),
    }

    def __init__(self, bucket_mb: float = 25.0, overlap: bool = True,
                 momentum_correction: str = "auto", keep_residual: bool = True):
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.keep_residual = keep_residual
        self.overlap = overlap
        self.momentum_correction = momentum_correction
        self._buckets: list[_Bucket] = []
        self._hooks: list[Any] = []
        self._start: list[torch.Tensor] | None = None  # corrected: parameters before the step
        self._held: list[torch.Tensor | None] = []  # kept residual: the codec's, before it
        self._quiet = False  # inside no_sync: backward's hooks leave the gradients be

    def init(self, params: list[torch.nn.Parameter], ctx: Context) -> dict[str, Any]:
        self.close()
        trainable = [p for p in params if p.requires_grad]
        # buffers (BatchNorm's running statistics) are averaged after each step: every worker
        # keeps the statistics of the global batch (DDP instead broadcasts rank 0's)
        self._buffers = [p for p in params if not isinstance(p, torch.nn.Parameter)]
        lossy = ctx.compressor.kind != "exact"
        limit = 0 if lossy else self.bucket_bytes  # lossy: one tensor each, scaled layer-wise
        self._buckets = [_Bucket(group) for group in _group(trainable[::-1], limit)]
        if lossy:
            n = ctx.transport.world_size
            self._corrected = corrects(self.momentum_correction, ctx.optimizer, ctx.compressor)
            self._keeps = self._corrected and self.keep_residual
            return {"codec": [init_all_reduce(ctx.compressor, b.like(), n)
                              for b in self._buckets]}
        if self.overlap:
            for bucket in self._buckets:
                for p in bucket.params:
                    self._hooks.append(p.register_post_accumulate_grad_hook(
                        lambda _p, b=bucket: self._ready(b, ctx)))
        return {}

    def check_optimizer(self, optimizer: torch.optim.Optimizer, codec: Any) -> None:
        """Refuse momentum_correction = 'on' with an optimizer that has no momentum."""
        corrects(self.momentum_correction, optimizer, codec)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside send nothing (as DDP's no_sync): the gradients of the
        micro-batches before the last (run.accumulate) add up in p.grad, and go out from
        the last backward's hooks, or, if that one runs inside too, from on_gradients."""
        self._quiet = True
        try:
            yield
        finally:
            self._quiet = False

    def _ready(self, bucket: _Bucket, ctx: Context) -> None:
        if self._quiet:
            return
        if bucket.handle is not None:  # its gradients left in an earlier backward
            raise UserError(SECOND_BACKWARD)
        bucket.pending -= 1
        if bucket.pending == 0:
            bucket.launch(ctx)

    def on_gradients(self, params: list[torch.nn.Parameter], state: dict[str, Any],
                     ctx: Context) -> None:
        if "codec" in state and self._corrected:  # the update moves after the step
            self._start = [bucket.gather_params() for bucket in self._buckets]
            if self._keeps:
                self._held = [_clone(unsent(ctx.compressor, s, start))
                              for start, s in zip(self._start, state["codec"])]
            return
        if "codec" in state:  # each layer encoded alone, all layers moved together
            means = all_reduce_means([b.gather_grads() for b in self._buckets],
                                     ctx.compressor, state["codec"], ctx.transport)
            for bucket, mean in zip(self._buckets, means):
                bucket.set_grads(mean.reshape(-1))
            return
        for bucket in self._buckets:  # buckets whose gradients did not all arrive (unused params)
            if bucket.handle is None:
                bucket.launch(ctx)
        means = [bucket.finish() for bucket in self._buckets]
        if self.overlap and not all_finite(means):
            # A worker's gradient was not finite though its loss was: its buckets had left
            # during backward, before the loop could see it and send zeros instead, and an
            # all-reduce takes no part back. Every worker holds the same mean, so all drop
            # this step's update alike and the replicas stay in step.
            for bucket in self._buckets:
                for p in bucket.params:
                    p.grad = None

    def on_parameters(self, params: list[torch.nn.Parameter], state: dict[str, Any],
                      ctx: Context) -> None:
        """Buffers are averaged. Momentum correction: every worker restarts from the shared
        parameters plus the mean of the changes its peers' optimizer steps made, moved by the
        codec, plus (keep_residual) what its own codec has held back so far."""
        if self._buffers:
            flat = torch.cat([b.reshape(-1) for b in self._buffers])
            ctx.transport.all_reduce(flat, average=True)
            for b, view in zip(self._buffers, flat.split([b.numel() for b in self._buffers])):
                b.copy_(view.view_as(b))
        if self._start is None:
            return
        changes = [b.gather_params() - start for b, start in zip(self._buckets, self._start)]
        means = all_reduce_means(changes, ctx.compressor, state["codec"], ctx.transport)
        for start, held, codec, like in zip(self._start, self._held, state["codec"], changes):
            now = unsent(ctx.compressor, codec, like)  # held back, this step's included
            if held is not None and now is not None:
                start.add_(now).sub_(held)
        self._held = []
        with torch.no_grad():
            for bucket, start, mean in zip(self._buckets, self._start, means):
                for p, view in zip(bucket.params, start.add_(mean).split(
                        [p.numel() for p in bucket.params])):
                    p.copy_(view.view_as(p))
        self._start = None

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _group(params: list[torch.nn.Parameter], limit: int) -> list[list[torch.nn.Parameter]]:
    """Consecutive groups of at most `limit` bytes (a larger tensor gets a group of its own);
    a group never mixes dtypes or devices, since it becomes one flat buffer."""
    groups: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        p_bytes = p.numel() * p.element_size()
        same_kind = groups and (groups[-1][0].dtype, groups[-1][0].device) == (p.dtype, p.device)
        if same_kind and size + p_bytes <= limit:
            groups[-1].append(p)
            size += p_bytes
        else:
            groups.append([p])
            size = p_bytes
    return groups
