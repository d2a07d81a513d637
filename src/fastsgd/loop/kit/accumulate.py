"""A step's forward and backward over its run.accumulate micro-batches: each weighs its
samples, the gradients leave the worker only after the last (DDP's no_sync), and a loss
that is not finite ends the step there (worker.check_finite skips it; under DDP its
backward still runs, with NaN gradients, so that every worker skips it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack

import torch

from fastsgd.loop.context import LoopContext
from fastsgd.strategies.params import all_finite


def forward_backward(ctx: LoopContext, x: torch.Tensor, y: torch.Tensor,
                     charged: Callable[[], None]) -> tuple[float, bool]:
    """Forward and backward of each of the run.accumulate micro-batches, `charged()` after
    the last forward; the batch's loss, and whether it and the gradients are finite (read
    here: the simulator may run this on a compute lane, transport.offload, and the
    gradients are still in its cache). A micro-batch whose loss is not finite ends it
    there: the step is skipped (check_finite)."""
    parts = min(ctx.accumulate, len(x))
    micro = list(zip(x.tensor_split(parts), y.tensor_split(parts)))
    total = 0.0
    for i, batch in enumerate(micro):
        last = i == parts - 1
        with held(ctx, last):
            with ctx.precision.autocast():  # the forward only: backward follows its ops
                loss = ctx.checked_step(ctx.replica.forward_module, batch)
            if last:
                charged()
            value = float(loss.detach())
            if not math.isfinite(value) and not reduces_in_backward(ctx):
                if not last:
                    charged()
                return value, False
            # each micro-batch weighs its samples: the mean over the batch, as one backward
            share = len(batch[0]) / len(x)
            total += value * share
            # (a loss not finite under DDP: NaN gradients, whatever its graph's slopes)
            weight = ctx.state.weight * share if math.isfinite(value) else math.nan
            ctx.precision.backward(loss * weight if weight != 1 else loss)
    ctx.checked_step.backward_done()
    ctx.precision.unscale(ctx.optimizer)  # fp16: before the strategy sees the gradients
    return total, all_finite([p.grad.detach() for p in ctx.weights if p.grad is not None])


def reduces_in_backward(ctx: LoopContext) -> bool:
    """Whether the forward module's backward reduces among the workers (DDP's reducer): a
    worker whose loss is not finite must then run its backward too, or its peers wait for
    it. Its NaN gradients make the mean NaN on every worker, which all then skip alike."""
    return ctx.replica.forward_module is not ctx.model


def held(ctx: LoopContext, last: bool) -> AbstractContextManager[object]:
    """Where a backward's gradients must not leave the worker yet: the micro-batches before
    the last (allreduce's hooks and DDP's reducer would send each, as DDP's no_sync
    avoids), and under fp16 the last too from the strategy's hooks, as its gradients are
    still scaled (DDP's reducer may send them: every worker then unscales the same mean
    with the same scale, so its scaler stays in step)."""
    stack = ExitStack()
    if not last or ctx.precision.holds_gradients:
        no_sync = getattr(ctx.replica.strategy, "no_sync", None)
        if callable(no_sync):
            stack.enter_context(no_sync())
    wrapper = ctx.replica.forward_module
    if not last and wrapper is not ctx.model and callable(getattr(wrapper, "no_sync", None)):
        stack.enter_context(wrapper.no_sync())
    return stack
