"""Flat views of a parameter list, shared by the strategies that move whole models."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector

from fastsgd.compress.collectives import all_reduce_mean


def buffer_mask(params: list[torch.Tensor]) -> torch.Tensor | None:
    """Which elements of `flatten(params)` are buffers (BatchNorm's running statistics: the
    tensors that are not nn.Parameters), or None if there are none. Strategies that filter
    a global model (bmuf's block momentum, diloco's outer Nesterov step) give buffers the
    workers' plain mean: a step past it could take a running variance below zero."""
    if all(isinstance(p, torch.nn.Parameter) for p in params):
        return None
    return torch.cat([torch.full((p.numel(),), not isinstance(p, torch.nn.Parameter),
                                 device=p.device) for p in params])


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """No NaN or inf in any of `tensors` (both carry over into a sum). On the CPU a sum per
    tensor read back as a float is 20-30 us cheaper for an MLP than stacking the sums; on a
    GPU the stack is read back once, not once per tensor."""
    if not tensors:
        return True
    if tensors[0].device.type == "cpu":
        return math.isfinite(sum(float(t.sum()) for t in tensors))
    return bool(torch.isfinite(torch.stack([t.sum() for t in tensors])).all())


def flatten(params: list[torch.nn.Parameter], dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new 1-D tensor holding all parameters (a copy, safe to send); in `dtype` if given,
    converted as it is copied (one pass, not two)."""
    if dtype is None:
        return parameters_to_vector([p.detach() for p in params])
    out = torch.empty(sum(p.numel() for p in params), dtype=dtype, device=params[0].device)
    return torch.cat([p.detach().reshape(-1) for p in params], out=out)


def assign(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy a flat vector into the parameters (they keep their own storage)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def mix_into(params: list[torch.nn.Parameter],
             terms: list[tuple[torch.Tensor | None, float]]) -> None:
    """Each parameter becomes sum_i c_i * term_i (flat vectors, each read at the parameter's
    slice; None: the parameters themselves), summed in the order given, tensor by tensor:
    no model-sized temporary and no copy back (gossip's mixes)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            out, size = p.detach().view(-1), p.numel()
            for i, (term, coefficient) in enumerate(terms):
                part = out if term is None else term[offset:offset + size]
                if i == 0:
                    torch.mul(part, coefficient, out=out)
                else:
                    out.add_(part, alpha=coefficient)
            offset += size


def average(params: list[torch.nn.Parameter], transport) -> torch.Tensor:
    """The mean of the parameters of every worker still in the run (one all-reduce), as a
    flat vector. A 1 rides along and counts the workers that took part: once workers are
    lost, one found lost during the all-reduce may or may not be in the sum."""
    one = torch.ones(1, dtype=params[0].dtype, device=params[0].device)
    flat = parameters_to_vector([*(p.detach() for p in params), one])
    transport.all_reduce(flat)
    return flat[:-1].div_(flat[-1])


def coded(flat: torch.Tensor, buffers: torch.Tensor | None) -> torch.Tensor:
    """The elements of `flat` that a lossy codec carries: all but the buffers (`buffers`,
    from buffer_mask, or None: there are none)."""
    return flat if buffers is None else flat[~buffers]


def lossy_mean(x: torch.Tensor, buffers: torch.Tensor | None, ctx: Any,
               codec_state: dict[str, Any]) -> torch.Tensor:
    """The mean over workers of `x` (flat, laid out as flatten(params)): its parameter elements
    through the codec, its buffer elements by an exact all-reduce beside it, whose bytes the
    transport counts. A codec's error on BatchNorm's statistics (qsgd's noise) could take a
    running variance below zero, and error feedback would carry them from round to round;
    `codec_state` is of `coded(x, buffers)`."""
    if buffers is None:
        return all_reduce_mean(x, ctx.compressor, codec_state, ctx.transport)
    mean = torch.empty_like(x)
    exact = x[buffers]  # a copy (boolean indexing)
    ctx.transport.all_reduce(exact, average=True)
    mean[buffers] = exact
    if not buffers.all():  # (buffers alone leave the codec nothing)
        mean[~buffers] = all_reduce_mean(x[~buffers], ctx.compressor, codec_state,
                                         ctx.transport)
    return mean


def mean_change(params: list[torch.nn.Parameter], anchor: torch.Tensor, ctx: Any,
                codec_state: dict[str, Any], buffers: torch.Tensor | None) -> torch.Tensor:
    """The mean over workers of (parameters - anchor), moved by the codec (buffers beside it,
    exactly: lossy_mean). Parameters are compressed as their change since a point every
    worker shares (the last average), which behaves like a gradient, rather than as raw
    values."""
    return lossy_mean(flatten(params) - anchor, buffers, ctx, codec_state)
