"""SparseLoCo: DiLoCo's rounds, with a sparse, 2-bit, error-feedback outer step.

Sarfi, Thérien, Lidin & Belilovsky, 2025, "Communication Efficient LLM Pre-training with
SparseLoCo" (arXiv 2508.15706). Every worker runs the user's optimizer for `period` inner
steps (H = 15, the shortest of the paper's 15, 30, 50 and 100), as in DiLoCo (diloco.py,
which this class extends). Then, with the pseudo-gradient D = global - local and e the
worker's own error-feedback accumulator (its state; no outer momentum, which e stands in
for):

    e <- beta e + D                          (beta = 0.95)
    s = Q(TopK(e))                           what the worker sends
    e <- e - s                               what was not sent waits for the next round
    global <- global - outer_lr mean(s)      the mean over workers (outer_lr = 1)

and every worker restarts from the new global parameters. Unlike diloco's default (0,
scaled to the run), `period` is not scaled: a run shorter than it has one round, after its
last step.

TopK is chunked: each parameter tensor, flat, is cut into chunks of `chunk` (4096) elements,
and each chunk keeps its ceil(density * length) largest magnitudes (at least one): 64 of 4096
at the default density 1/64 (1.56%). The last chunk of a tensor may be short (a tensor
smaller than a chunk is one short chunk) and keeps the same fraction of its length. Q (the
paper's 2 bits; these levels are this module's choice), per chunk: a scale, the largest kept
magnitude (float32), and each kept value rounded to the nearest of 2^bits levels spread
evenly over [-scale, scale] (bits = 2: -scale, -scale/3, scale/3, scale); bits = 32 sends
the values as float32, unquantized.

On the wire, once a round (after step k when (k + 1) % period == 0, and after the last step,
so the replicas end identical): one all-gather of one uint8 buffer a worker (compress/wire.py
`pack`): each kept element's offset in its chunk in ceil(log2 chunk) bits (12), its code in
`bits` bits, one float32 scale a chunk, and, dense, any buffers (BatchNorm's statistics: they
take the workers' plain mean, with no error feedback). The workers keep different indices,
so the payloads are gathered, not summed, as the sparse codecs' are (compress/collectives.py):
a worker sends (n - 1) times its buffer, and the transport counts those bytes. Nothing else
crosses the wire.

State (plain tensors): `global` (the flat global parameters) and `error` (e), both the
model's size. A lost worker takes what it had not sent with it; the survivors average what
they gathered (on real processes, the group shrinks). Codecs: only `none`, the payload being
already sparse and quantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fastsgd.compress.bits import pack_bits, unpack_bits
from fastsgd.compress.sparse import kept, unit_ratio
from fastsgd.compress.wire import pack, unpack
from fastsgd.config.options import Option, at_least, between, positive
from fastsgd.strategies.base import Context
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.diloco import DiLoCo
from fastsgd.strategies.params import assign, buffer_mask, flatten

Params = list[torch.nn.Parameter]
BITS = (2, 4, 8, 32)  # 32: float32 values, unquantized
FIELDS = ["indices", "codes", "scales", "buffers"]


def _bits(v: int) -> str | None:
    return None if v in BITS else f"must be one of {', '.join(map(str, BITS))}"


@dataclass(frozen=True)
class _Run:
    """`rows` consecutive chunks of `length` elements from `start` of the flat vector, each
    keeping its `k` largest magnitudes."""

    start: int
    rows: int
    length: int
    k: int


class SparseLoCo(DiLoCo):
    name = "sparseloco"
    capabilities = Capabilities(
        drains_at_end=True,  # a round after the last step: the replicas end identical
        carries_on=("exact",),  # the survivors' mean of what they gathered
        shrinks_real=True)
    OPTIONS = {
        "period": Option(int, 15, at_least(1), "inner steps between outer steps (H)",
                         steps=True),
        "outer_lr": Option(float, 1.0, positive, "outer learning rate (plain SGD)"),
        "beta": Option(float, 0.95, between(0, 1), "decay of the error-feedback accumulator"),
        "chunk": Option(int, 4096, at_least(1), "elements of a top-k chunk (the last of a "
                        "tensor may be shorter)"),
        "density": Option(float, 0.015625, unit_ratio, "fraction of each chunk sent "
                          "(64 of 4096)"),
        "bits": Option(int, 2, _bits, "bits of each value sent (32: unquantized float32)"),
    }

    def __init__(self, period: int = 15, outer_lr: float = 1.0, beta: float = 0.95,
                 chunk: int = 4096, density: float = 0.015625, bits: int = 2):
        super().__init__(period=period, outer_lr=outer_lr, outer_momentum=0.0)
        self.beta, self.chunk, self.density, self.bits = beta, chunk, density, bits
        self._width = max(1, (chunk - 1).bit_length())  # bits of an offset in a chunk
        self._runs: list[_Run] = []

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        state = super().init(params, ctx)  # `global`, and zeros for the outer momentum:
        state["error"] = state.pop("momentum")  # which the accumulator replaces
        self.plan(params)
        return state

    def plan(self, params: list[torch.Tensor]) -> None:
        """The chunks of `params` (buffers, the tensors that are not nn.Parameters, excepted),
        and for each kept element its chunk's start in the flat vector and its chunk's number."""
        self._buffers = buffer_mask(params)
        runs, start = [], 0
        for p in params:
            n, full = p.numel(), p.numel() // self.chunk
            if isinstance(p, torch.nn.Parameter):
                if full:
                    runs.append(_Run(start, full, self.chunk, kept(self.chunk, self.density)))
                if n > full * self.chunk:
                    tail = n - full * self.chunk
                    runs.append(_Run(start + full * self.chunk, 1, tail,
                                     kept(tail, self.density)))
            start += n
        self._runs = runs
        device = params[0].device
        starts = torch.cat([r.start + torch.arange(r.rows) * r.length for r in runs])
        counts = torch.tensor([r.k for r in runs for _ in range(r.rows)], dtype=torch.int64)
        self._base = starts.repeat_interleave(counts).to(device)
        self._chunk_of = torch.arange(len(counts)).repeat_interleave(counts).to(device)

    def held_model(self, state: dict[str, Any]) -> torch.Tensor:
        """The global model of the last outer step, which the paper evaluates."""
        return state["global"]

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if ctx.last_step or self.due(0, ctx.step):
            self._round(params, state, ctx)

    def _round(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        local = flatten(params)
        target = self.beta * state["error"] + (state["global"] - local)
        if self._buffers is not None:  # not in the accumulator: sent dense (`compress`)
            target[self._buffers] = 0
        mine = self.compress(target, local)
        gathered = ctx.transport.all_gather(mine)
        # nothing changes before the exchange is done: one that failed (a worker lost) is
        # done again as it was, among the survivors
        sent = self.decode(mine, target)
        mean = sum(self.decode(g, target, src) for src, g in enumerate(gathered))
        mean = mean / len(gathered)
        error = target - sent
        new = state["global"] - self.outer_lr * mean
        if self._buffers is not None:  # the workers' plain mean, no feedback
            error[self._buffers] = 0
            new[self._buffers] = mean[self._buffers]
        state["error"].copy_(error)
        state["global"].copy_(new)
        assign(params, state["global"])
        ctx.worked()

    def compress(self, target: torch.Tensor, local: torch.Tensor | None = None) -> torch.Tensor:
        """The buffer a worker sends for `target` (flat): chunked top-k, quantized, packed;
        with the buffers' values of `local` where the model has buffers."""
        offsets, values = [], []
        for run in self._runs:
            rows = target[run.start:run.start + run.rows * run.length].view(run.rows, -1)
            picked = rows.abs().topk(run.k, dim=1, sorted=False).indices.sort(dim=1).values
            offsets.append(picked.reshape(-1))
            values.append(rows.gather(1, picked))
        dense = local[self._buffers] if self._buffers is not None and local is not None \
            else target[:0]
        codes, scales = self._quantize(values)
        return pack({"indices": pack_bits(torch.cat(offsets), self._width), "codes": codes,
                     "scales": scales, "buffers": dense})

    def _quantize(self, values: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The codes (packed `bits` each) and per-chunk float32 scales of each run's kept
        values (rows: chunks)."""
        if self.bits == 32:
            return torch.cat([v.reshape(-1) for v in values]).float(), torch.zeros(0)
        levels, codes, scales = 2 ** self.bits - 1, [], []
        for v in values:
            scale = v.abs().amax(dim=1, keepdim=True).float()
            s = scale.to(v.dtype)
            unit = torch.where(s > 0, v / s, torch.zeros_like(v))  # in [-1, 1]
            codes.append(((unit + 1) * (levels / 2)).round().clamp(0, levels).reshape(-1))
            scales.append(scale.reshape(-1))
        return pack_bits(torch.cat(codes).to(torch.int64), self.bits), torch.cat(scales)

    def decode(self, buffer: torch.Tensor, like: torch.Tensor, src: int | str = "?"
               ) -> torch.Tensor:
        """The flat tensor (like's size and dtype) that a worker's buffer stands for: its
        kept values, its buffers' values, zeros elsewhere."""
        fields = unpack(buffer, FIELDS, src)
        count = len(self._base)
        index = self._base + unpack_bits(fields["indices"], count, self._width)
        if self.bits == 32:
            values = fields["codes"].to(like.dtype)
        else:
            levels = 2 ** self.bits - 1
            codes = unpack_bits(fields["codes"], count, self.bits)
            scale = fields["scales"].to(like.dtype)[self._chunk_of]
            values = scale * ((2 * codes - levels).to(like.dtype) / levels)  # top: scale
        out = torch.zeros_like(like)
        out[index] = values
        if self._buffers is not None:
            out[self._buffers] = fields["buffers"].to(like.dtype)
        return out
