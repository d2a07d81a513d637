"""SPARTA: sparse parameter averaging.

Beton, Baioumy, van der Ouderaa, Reed, Howes, Cheema & Vrabie (EXO Labs, 2025), "SPARTA:
sparse parameter averaging". Every worker trains with the user's optimizer and its own
data; after each optimizer step all workers average the SAME random subset of the parameter
entries, a `fraction` of them (0.05% to 0.5% in the paper; 0.5% here by default), and keep
the rest as they are. After the last step (ctx.last_step) they average every entry, so the
replicas end identical.

The subset of step s is k of the N parameter entries (floating-point buffers counted in N),
k = max(1, round(fraction * N)), drawn by a generator seeded with `seed * 1_000_003 + s`:
every worker draws the same indices without a word, on real processes and in the simulator
alike, and a resumed run draws those it would have drawn. Where k <= N / 8 the draw costs
O(k), not a permutation of all N (11 ms a step for 0.84M entries, nine times the averaging):
k + k/4 + 16 draws with replacement, k of their distinct values at random (every k-subset
is as likely as any other, by symmetry); else `torch.randperm(N)[:k]`. Sorted either way.

Floating-point buffers (BatchNorm's running statistics) are not left to the draw: every step
all of them join the chosen entries and are averaged exactly (beside a lossy codec), as
`allreduce` averages them after every step, so every worker holds the statistics of the
global batch. A sample would do next to nothing for them: a running statistic is an average
of its recent batches (momentum 0.1: 0.9^20 = 12% of an averaged value is left after 20
steps) and an entry is drawn once in 1 / fraction steps (200), so each worker's statistics
would describe its own shard until the last step. The draw of the parameter entries is what
it was. Most models have few buffers or none (a transformer); ResNet-20 has 1,376 against
271,098 parameter entries, about k at the default fraction: its steps send twice the values.
Through a lossy codec, qsgd's noise could take a running variance below zero.

On the wire, each step: the k chosen values and the buffers (a dense vector) in one
all-reduce, and after the last step all N. The values themselves are averaged over the
workers taking part (the survivors, once one is lost) with the exact codec (`none`), and
after the last step with any codec: for an entry seldom chosen, the change since its last
average is most of the run's progress, too much for a codec to drop. Before the last step a
lossy codec carries, through compress/collectives.py `all_reduce_mean` as diloco does, the
change of the chosen entries since they were last averaged: a full-size `anchor`, identical
on every worker, holds each entry's last average, and a chosen entry becomes anchor + the
decoded mean change (a change is small and gradient-like; raw parameter values would lose
far more to quantizing). The codec's state is fresh at every step: the chosen entries change
from step to step, so an error-feedback residual would land on other parameters. The
buffers go beside the codec in an exact all-reduce (params.lossy_mean). `dgc` is refused
(its momentum correction and warm-up count messages as steps) and so is `powersgd` (a
low-rank factor of a random subset of entries has no structure to find).

State (plain tensors, so it checkpoints): nothing with the exact codec (the indices come
from the seed and the step); with a lossy codec, `anchor`.
"""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.compress.collectives import init_all_reduce
from fastsgd.config.options import Option
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.params import assign, buffer_mask, coded, flatten, lossy_mean

Params = list[torch.nn.Parameter]
SEED_STRIDE = 1_000_003  # seed * SEED_STRIDE + step seeds the choice of step `step`


def _fraction(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


class Sparta(StrategyBase):
    name = "sparta"
    capabilities = Capabilities(
        codec_kinds=("exact", "quantize", "sparse"),
        refused_codecs=("dgc",),  # momentum correction and warm-up meant for gradients
        # the exact all-reduce averages over the survivors (transport.all_reduce average=True)
        carries_on=("exact",),
        shrinks_real=True,  # where carries_on allows: also on real processes (recovery.py)
        drains_at_end=True)  # averages every entry after the last step (ctx.last_step)
    OPTIONS = {
        "fraction": Option(float, 0.005, _fraction,
                           "share of the parameter entries averaged each step, in (0, 1]"),
        "seed": Option(int, 0, doc="seed of the choice of entries (with the step number)"),
    }

    def __init__(self, fraction: float = 0.005, seed: int = 0):
        self.fraction, self.seed = fraction, seed
        self._bounds = torch.zeros(1, dtype=torch.long)
        self._buffers: torch.Tensor | None = None  # params.buffer_mask
        self._buffer_index: torch.Tensor | None = None  # its flat indices (on the CPU)

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        sizes = torch.tensor([p.numel() for p in params], dtype=torch.long)
        self._bounds = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        self._buffers = buffer_mask(params)
        self._buffer_index = (None if self._buffers is None
                              else self._buffers.nonzero().view(-1).cpu())
        if ctx.compressor.kind == "exact":
            return {}
        return {"anchor": flatten(params)}  # every replica starts from rank 0's parameters

    def count(self, numel: int) -> int:
        """How many entries are drawn each step (before the last)."""
        return min(numel, max(1, round(self.fraction * numel)))

    def chosen(self, numel: int, step: int) -> torch.Tensor:
        """The sorted flat indices drawn for step `step`: the same on every worker (the
        entries averaged are these and the buffers: `averaged`)."""
        generator = torch.Generator().manual_seed(self.seed * SEED_STRIDE + step)
        k = self.count(numel)
        if 8 * k <= numel:
            draws = torch.randint(numel, (k + k // 4 + 16,), generator=generator).unique()
            if len(draws) >= k:  # almost always: about k/16 draws repeat
                pick = torch.randperm(len(draws), generator=generator)[:k]
                return draws[pick].sort().values
        return torch.randperm(numel, generator=generator)[:k].sort().values

    def averaged(self, numel: int, step: int) -> torch.Tensor:
        """The sorted flat indices averaged after step `step`: those drawn, and every
        buffer (see the module's docstring)."""
        drawn = self.chosen(numel, step)
        if self._buffer_index is None:
            return drawn
        return torch.cat([drawn, self._buffer_index]).unique()  # sorted

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None  # gradients stay local

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        numel = int(self._bounds[-1])
        index = None if ctx.last_step else self.averaged(numel, ctx.step)
        ctx.worked(1.0 if index is None else len(index) / numel)
        values = flatten(params) if index is None else _gather(params, index, self._bounds)
        if "anchor" in state and index is not None:
            values = self._lossy(values, index, state["anchor"], ctx)
        else:  # nothing is changed before the all-reduce returns: a failed one is redone
            ctx.transport.all_reduce(values, average=True)
        if index is None:
            assign(params, values)
            if "anchor" in state:
                state["anchor"].copy_(values)
            return
        _scatter(params, index, self._bounds, values)
        if "anchor" in state:
            state["anchor"][index.to(state["anchor"].device)] = values

    def _lossy(self, values: torch.Tensor, index: torch.Tensor, anchor: torch.Tensor,
               ctx: Context) -> torch.Tensor:
        """The workers' mean of the entries at `index`: their last average (`anchor`) plus
        the mean change since, the parameters' through a fresh codec state, the buffers'
        exact."""
        last = anchor[index.to(anchor.device)]
        change = values - last
        plain = None if self._buffers is None else self._buffers[index.to(change.device)]
        codec = init_all_reduce(ctx.compressor, coded(change, plain), ctx.transport.world_size)
        return last + lossy_mean(change, plain, ctx, codec)

    def close(self) -> None:
        return None


def _pieces(index: torch.Tensor, bounds: torch.Tensor) -> list[tuple[int, int, int]]:
    """For sorted flat indices: (tensor i, first, last) such that index[first:last] fall in
    tensor i, for every tensor that holds any."""
    cuts = torch.searchsorted(index, bounds).tolist()
    return [(i, a, b) for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])) if b > a]


def _gather(params: Params, index: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """The entries at flat `index` (sorted) of the parameters, as a new vector; only the
    chosen entries are read, no model-sized copy."""
    parts = []
    for i, a, b in _pieces(index, bounds):
        local = (index[a:b] - bounds[i]).to(params[i].device)
        parts.append(params[i].detach().reshape(-1)[local])
    return torch.cat(parts)


def _scatter(params: Params, index: torch.Tensor, bounds: torch.Tensor,
             values: torch.Tensor) -> None:
    """Write `values` at flat `index` (sorted) of the parameters, in place."""
    with torch.no_grad():
        for i, a, b in _pieces(index, bounds):
            p = params[i]
            local = (index[a:b] - bounds[i]).to(p.device)
            if p.is_contiguous():
                p.view(-1)[local] = values[a:b]
            else:  # (a view of a non-contiguous tensor is not its storage)
                flat = p.detach().reshape(-1).clone()
                flat[local] = values[a:b]
                p.copy_(flat.view_as(p))

