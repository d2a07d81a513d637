"""Model averaging: workers train locally and average their parameters from time to time.

- `localsgd`: every `period` steps, all-reduce the parameters and take the mean; the first
  `warmup` steps all-reduce gradients every step instead (post-local SGD, Lin et al. 2020).
  On the wire: gradients during warm-up, then parameters once every `period` steps.
- `easgd`: elastic averaging (Zhang, Choromanska & LeCun 2015), synchronous form: every
  `period` steps each worker moves by `alpha` toward a centre variable that every worker
  keeps a copy of, and the centre moves by `alpha` times the sum of the workers' distances
  to it (one all-reduce of the differences). On the wire: parameter differences.
- `bmuf`: block-wise model-update filtering (Chen & Huo 2016): every `period` steps the mean
  of the workers' models is a block update of a global model, filtered by block momentum;
  with `nesterov`, workers restart from the look-ahead point. The defaults keep the filter's
  gain at 1 (block_lr = 1 - block_momentum): the paper's block_lr = 1 with block momentum
  1 - 1/n diverged here beside local momentum SGD. On the wire: parameters.

With a lossy codec, what the three all-reduce is the change since a point all workers share
(the last average, the centre, the global model), compressed with error feedback.
Floating-point buffers (BatchNorm's running statistics) bypass the codec: their change goes
in an exact all-reduce beside it (params.lossy_mean), as diloco's does, so they move as with
the exact codec: `localsgd` and `bmuf` restart every worker from their exact mean, `easgd`
pulls them toward an exact centre. Through the codec, qsgd's noise could take a running
variance below zero, and error feedback would carry statistics from round to round. The
codec's state (`average_codec`) is of the parameter elements only.
"""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.compress.base import KINDS
from fastsgd.compress.collectives import init_all_reduce
from fastsgd.config.options import Option, at_least, between
from fastsgd.errors import ConfigError
from fastsgd.strategies.allreduce import AllReduce
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.params import assign, average, buffer_mask, coded, flatten, mean_change

Params = list[torch.nn.Parameter]


def _auto_or_open(v: float) -> str | None:
    return None if 0 <= v < 1 else "must be 0 (auto) or in (0, 1)"


def _auto_alpha(workers: int) -> float:
    """The default elastic force: 0.1, and n alpha = 0.9 (Zhang et al. 2015) past 9 workers."""
    return min(0.1, 0.9 / workers)


class _Periodic(StrategyBase):
    """Shared shape: no gradient exchange; act on parameters at the end of each period."""

    OPTIONS: dict[str, Option] = {"period": Option(int, 8, at_least(1), "steps between rounds",
                                                   steps=True)}

    def __init__(self, period: int = 8):
        self.period = period
        self._buffers: torch.Tensor | None = None  # params.buffer_mask, set by init

    def _mean_change(self, params: Params, anchor: torch.Tensor, state: dict[str, Any],
                     ctx: Context) -> torch.Tensor:
        """The workers' mean change since `anchor`: the codec's, buffers exact beside it."""
        return mean_change(params, anchor, ctx, state["average_codec"], self._buffers)

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        return {}

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def due(self, ctx: Context, offset: int = 0) -> bool:
        """A round ends after this step (and always after the last one)."""
        return (ctx.step + 1 - offset) % self.period == 0 or ctx.last_step

    def close(self) -> None:
        return None


class LocalSGD(_Periodic):
    name = "localsgd"
    capabilities = Capabilities(
        codec_kinds=KINDS,
        carries_on=("exact",),  # shrinks: the survivors' average (params.average counts them)
        shrinks_real=True,
        drains_at_end=True)  # averages after the last step (ctx.last_step)
    OPTIONS = {**_Periodic.OPTIONS,
               "warmup": Option(int, 0, at_least(0), "synchronous steps before local SGD",
                                steps=True)}

    def __init__(self, period: int = 8, warmup: int = 0):
        super().__init__(period)
        self.warmup = warmup
        self._sync = AllReduce(overlap=False)

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        self._buffers = buffer_mask(params)
        return {**self._sync.init(params, ctx),
                **_codec_state(params, ctx, self._buffers, "anchor")}

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if ctx.step < self.warmup:
            self._sync.on_gradients(params, state, ctx)

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if ctx.step < self.warmup:  # allreduce's half after the step: buffers, and with a
            self._sync.on_parameters(params, state, ctx)  # lossy codec the update itself
            return
        if not self.due(ctx, self.warmup):
            return
        ctx.worked()
        if "anchor" not in state:
            assign(params, average(params, ctx.transport))
            return
        state["anchor"] += self._mean_change(params, state["anchor"], state, ctx)
        assign(params, state["anchor"])


class EASGD(_Periodic):
    name = "easgd"
    capabilities = Capabilities(
        codec_kinds=KINDS,
        carries_on=("exact",),  # shrinks: the centre moves by the survivors' distances
        shrinks_real=True,
        drains_at_end=True)  # a round after the last step (ctx.last_step)
    OPTIONS = {**_Periodic.OPTIONS,
               "alpha": Option(float, 0.0, _auto_or_open,
                               "elastic force, in (0, 1); 0: min(0.1, 0.9 / workers)")}

    def __init__(self, period: int = 8, alpha: float = 0.0):
        super().__init__(period)
        self.alpha = alpha
        self._force = alpha  # the alpha in use: 0's value for the run's workers, from init

    def check(self, world_size: int) -> None:
        """Each round multiplies the gap between the workers' mean and the centre by
        1 - (n + 1) alpha: past 2 it grows (Zhang et al. 2015 keep n alpha near 0.9)."""
        if (world_size + 1) * self.alpha >= 2:
            raise ConfigError(f"strategy.alpha = {self.alpha} with {world_size} workers: "
                              "the centre and the workers would drift apart ((workers + 1) "
                              f"* alpha >= 2); take {_auto_alpha(world_size):.3g}, or 0 for "
                              "that")

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        self.check(ctx.transport.world_size)
        self._force = self.alpha or _auto_alpha(ctx.transport.world_size)
        self._buffers = buffer_mask(params)
        return {"center": flatten(params), **_codec_state(params, ctx, self._buffers)}

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if not self.due(ctx):
            return
        center = state["center"]
        local = flatten(params)
        own = local - center
        if "average_codec" in state:
            total = ctx.transport.world_size * self._mean_change(params, center, state, ctx)
        else:
            total = own.clone()
            ctx.transport.all_reduce(total)
        # both moves from the distances before either (Zhang et al. 2015, eq. 5-6); and only
        # now: an exchange that failed (a worker died) is redone unchanged
        assign(params, local - self._force * own)
        center += self._force * total
        ctx.worked()


class BMUF(_Periodic):
    name = "bmuf"
    capabilities = Capabilities(
        codec_kinds=KINDS,
        carries_on=("exact",),  # shrinks: the block update is the survivors' mean
        shrinks_real=True,
        drains_at_end=True)  # a block update after the last step (ctx.last_step)
    OPTIONS = {**_Periodic.OPTIONS,
               "block_momentum": Option(float, 0.5, between(0, 0.999)),
               "block_lr": Option(float, 0.5, at_least(0), "1 - block_momentum: unit gain"),
               "nesterov": Option(bool, False, doc="restart workers from the look-ahead")}

    def __init__(self, period: int = 8, block_momentum: float = 0.5, block_lr: float = 0.5,
                 nesterov: bool = False):
        super().__init__(period)
        self.momentum, self.block_lr, self.nesterov = block_momentum, block_lr, nesterov

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        start = flatten(params)
        self._buffers = buffer_mask(params)
        return {"global": start, "delta": torch.zeros_like(start),
                **_codec_state(params, ctx, self._buffers)}

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if not self.due(ctx):
            return
        if "average_codec" in state:
            block_update = self._mean_change(params, state["global"], state, ctx)
        else:
            block_update = average(params, ctx.transport) - state["global"]
        mean = state["global"] + block_update
        state["delta"].mul_(self.momentum).add_(block_update, alpha=self.block_lr)
        state["global"] += state["delta"]
        if self._buffers is not None:  # unfiltered (params.buffer_mask)
            state["global"][self._buffers] = mean[self._buffers]
            state["delta"][self._buffers] = 0
        last = ctx.last_step or not self.nesterov
        start = state["global"] if last else state["global"] + self.momentum * state["delta"]
        assign(params, start)
        ctx.worked()


def _codec_state(params: Params, ctx: Context, buffers: torch.Tensor | None,
                 anchor: str = "") -> dict[str, Any]:
    """With a lossy codec: its state for the averaged vector's parameter elements (the
    buffers go beside it, exactly), and a shared anchor."""
    if ctx.compressor.kind == "exact":
        return {}
    start = flatten(params)
    part = coded(start, buffers)
    state = {"average_codec": init_all_reduce(ctx.compressor, part, ctx.transport.world_size)
             if part.numel() else {}}  # {}: a model of buffers only
    return {**state, anchor: start} if anchor else state
