"""DeMo: decoupled momentum, of which each step sends only the fast components.

Peng, Quesnelle & Kingma (Nous Research, 2024), "DeMo: Decoupled Momentum Optimization"
(arXiv 2411.19870), Algorithm 1 with its signum update. Each worker keeps a momentum of its
own, never averaged: m <- beta m + g (its own gradient; `beta` 0.999, the paper's code's
`compression_decay`). It takes m's fast components q: every parameter tensor, seen as a
matrix (a vector is one row; a tensor of more dimensions keeps its first dimension as rows),
is cut into chunks of h x w, where h and w are the largest divisors of its row and column
counts that are at most `chunk` (64; the paper's code chooses the same way, so there is no
padding: a dimension of prime size above `chunk` gets chunks of 1 along it), and each chunk
goes through an orthonormal 2-D DCT-II; q is the inverse DCT of the `topk` (32) largest
coefficients of each chunk by magnitude. The worker then keeps m <- m - q: what it did not
send. The workers all-gather their kept coefficients, and Q = the inverse DCT of the mean
over the workers of those coefficients = the mean of their q. on_gradients leaves sign(Q)
in p.grad (Q itself with `sign = false`), which the user's optimizer applies.

The optimizer must be torch.optim.SGD (or a subclass); another one is refused at the start
(Adam would rescale sign(Q) coordinate by coordinate). DeMo's momentum replaces SGD's: at
`init` each param group's momentum is set to 0 (and nesterov off), the user's values kept
under staleness.ORIGINAL as the adapting strategies keep theirs; its lr and weight_decay
stay. SGD's weight decay on sign(Q) is p <- p (1 - lr wd) - lr sign(Q): the paper code's
decoupled weight decay, exactly. Differences from the paper's code: its momentum adds lr g,
not g (the same with a constant lr: top-k and sign do not see the scale); and it averages a
coefficient over the workers that sent it, not over all of them (scatter_reduce "mean"),
which is not the mean of the workers' q that the paper writes. optimizer.clip_norm > 0 is
refused before the workers start (launch/preflight.py): it would clip sign(Q), not a gradient.
A Replica built without `optimizer=` cannot zero its momentum: give it SGD with momentum 0.

On the wire, each step: one all-gather of one buffer per worker, the kept coefficients' values
(in the parameters' dtype) then their indices inside their chunk (int16, int32 where a chunk
has more than 32767 elements): chunks x min(topk, h w) of each, over every trainable tensor.
Float buffers (BatchNorm's statistics), where the model has some, are averaged by an exact
all-reduce after each step. The state is `momentum`: the flat vector of the worker's momenta
(plain tensor, checkpointed). Codecs: the payload is already sparse-coded; only `none`.
Under a lost worker the survivors go on (exact codec): Q is their mean, and the momentum
moves only once the gather has succeeded, so a step redone after the group shrank counts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fastsgd.compress.base import Compressor
from fastsgd.config.options import Option, at_least
from fastsgd.errors import UserError
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.params import assign, average
from fastsgd.strategies.staleness import ORIGINAL

Params = list[torch.nn.Parameter]

_MATRICES: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _below_one(v: float) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


def _power_of_two(v: int) -> str | None:
    return None if v > 0 and v & (v - 1) == 0 else "must be a power of two (1, 2, 4, ..., 64)"


def dct_matrix(n: int, dtype: torch.dtype = torch.float64,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """The orthonormal DCT-II matrix D (n x n): (D x)_k = s_k sum_i x_i cos(pi (2i + 1) k / 2n),
    s_0 = sqrt(1/n), s_k = sqrt(2/n); D D^T = I, so its inverse is D^T. Cached."""
    key = (n, dtype, torch.device(device))
    if key not in _MATRICES:
        k = torch.arange(n, dtype=torch.float64)[:, None]
        i = torch.arange(n, dtype=torch.float64)[None, :]
        d = torch.cos(torch.pi * (2 * i + 1) * k / (2 * n)) * (2.0 / n) ** 0.5
        d[0] /= 2 ** 0.5
        _MATRICES[key] = d.to(dtype=dtype, device=device)
    return _MATRICES[key]


def chunk_size(n: int, target: int) -> int:
    """The largest divisor of n that is at most `target` (the paper code's choice)."""
    return max(d for d in range(1, min(n, target) + 1) if n % d == 0)


def as_matrix(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """How a tensor of `shape` is chunked: (rows, columns)."""
    numel = int(torch.Size(shape).numel())
    rows = shape[0] if len(shape) > 1 else 1
    return rows, numel // rows


def encode(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The 2-D DCT-II of each h x w chunk of matrix x (rows, cols), one chunk a row:
    (rows/h * cols/w, h w), chunks in row-major order."""
    rows, cols = x.shape
    blocks = x.reshape(rows // h, h, cols // w, w).transpose(1, 2)
    dh, dw = dct_matrix(h, x.dtype, x.device), dct_matrix(w, x.dtype, x.device)
    return (dh @ blocks @ dw.T).reshape(-1, h * w)


def decode(c: torch.Tensor, rows: int, cols: int, h: int, w: int) -> torch.Tensor:
    """The inverse of `encode`: the (rows, cols) matrix whose chunks have coefficients c."""
    dh, dw = dct_matrix(h, c.dtype, c.device), dct_matrix(w, c.dtype, c.device)
    blocks = dh.T @ c.reshape(rows // h, cols // w, h, w) @ dw
    return blocks.transpose(1, 2).reshape(rows, cols)


@dataclass(frozen=True)
class _Tensor:
    """One trainable tensor's place: its slice of the flat vectors, how it is chunked, and
    where its kept coefficients sit in a message."""

    start: int
    rows: int
    cols: int
    h: int
    w: int
    k: int  # coefficients kept per chunk

    @property
    def chunks(self) -> int:
        return (self.rows // self.h) * (self.cols // self.w)

    @property
    def end(self) -> int:
        return self.start + self.rows * self.cols


class DeMo(StrategyBase):
    name = "demo"
    # survivors go on: Q is the mean of the coefficients gathered from those left
    capabilities = Capabilities(carries_on=("exact",), shrinks_real=True)
    OPTIONS = {
        "beta": Option(float, 0.999, _below_one, "momentum decay of each worker's own momentum"),
        "topk": Option(int, 32, at_least(1), "DCT coefficients kept per chunk (at most h w)"),
        "chunk": Option(int, 64, _power_of_two,
                        "chunk side: each dimension cut in its largest divisor <= this"),
        "sign": Option(bool, True, doc="apply sign(Q), the paper's signum (false: Q itself)"),
    }

    def __init__(self, beta: float = 0.999, topk: int = 32, chunk: int = 64, sign: bool = True):
        self.beta, self.topk, self.chunk, self.sign = beta, topk, chunk, sign
        self._tensors: list[_Tensor] = []

    def check_optimizer(self, optimizer: torch.optim.Optimizer, codec: Compressor) -> None:
        if not isinstance(optimizer, torch.optim.SGD):
            raise UserError(f"strategy.name = '{self.name}' applies sign(Q) through plain SGD "
                            f"(its own momentum replaces the optimizer's); "
                            f"{type(optimizer).__name__} would rescale it: set "
                            "optimizer.name = 'sgd'")

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        trainable = [p for p in params if p.requires_grad]
        self._buffers = [p for p in params if not isinstance(p, torch.nn.Parameter)]
        self._tensors, start = [], 0
        for p in trainable:
            rows, cols = as_matrix(p.shape)
            h, w = chunk_size(rows, self.chunk), chunk_size(cols, self.chunk)
            self._tensors.append(_Tensor(start, rows, cols, h, w, min(self.topk, h * w)))
            start += p.numel()
        largest = max((t.h * t.w for t in self._tensors), default=1)
        self._index_dtype = torch.int16 if largest <= 2 ** 15 - 1 else torch.int32
        like = trainable[0] if trainable else torch.zeros(0)
        self._base = torch.cat([  # each kept coefficient's chunk's start in the flat vector
            (t.start + torch.arange(t.chunks, device=like.device) * t.h * t.w)
            .repeat_interleave(t.k) for t in self._tensors] or [torch.zeros(0, dtype=torch.long)])
        if ctx.optimizer is not None:
            for group in ctx.optimizer.param_groups:  # DeMo's momentum replaces SGD's
                group.setdefault(ORIGINAL, {k: group[k] for k in ("momentum", "nesterov")
                                            if k in group})
                group.update(momentum=0.0, nesterov=False)
        return {"momentum": torch.zeros(start, dtype=like.dtype, device=like.device)}

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        trainable = [p for p in params if p.requires_grad]
        if not trainable:
            return
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                           for p in trainable])
        momentum = state["momentum"] * self.beta + grads
        ctx.worked()  # a DCT of the whole momentum, and its inverse, every step
        indices, values = self.extract(momentum)
        gathered = ctx.transport.all_gather(self.pack(indices, values))
        mean = torch.zeros_like(momentum)  # the coefficients, summed in rank order
        for buffer in gathered:
            local, sent = self.unpack(buffer, momentum.dtype)
            mean.index_add_(0, self._base + local.long(), sent)
        update = self.inverse(mean.div_(len(gathered)))
        own = torch.zeros_like(momentum)
        own[self._base + indices] = values
        state["momentum"].copy_(momentum - self.inverse(own))  # only now: the gather is done
        if self.sign:
            update.sign_()
        offset = 0
        for p in trainable:
            p.grad = update[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def extract(self, momentum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The `topk` largest DCT coefficients by magnitude of each chunk of each tensor of
        the flat `momentum`: their indices inside their chunk (int64) and their values."""
        indices, values = [], []
        for t in self._tensors:
            coefficients = encode(momentum[t.start:t.end].view(t.rows, t.cols), t.h, t.w)
            top = coefficients.abs().topk(t.k, dim=1, sorted=False).indices
            indices.append(top.reshape(-1))
            values.append(coefficients.gather(1, top).reshape(-1))
        return torch.cat(indices), torch.cat(values)

    def inverse(self, coefficients: torch.Tensor) -> torch.Tensor:
        """The flat vector whose tensors' chunks have the flat `coefficients`."""
        return torch.cat([decode(coefficients[t.start:t.end], t.rows, t.cols, t.h, t.w)
                          .reshape(-1) for t in self._tensors])

    def pack(self, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """One message: the values, then the indices inside their chunks, as bytes."""
        return torch.cat([values.reshape(-1).view(torch.uint8),
                          indices.to(self._index_dtype).view(torch.uint8)])

    def unpack(self, buffer: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A peer's message: (indices inside their chunks, values)."""
        cut = len(self._base) * dtype.itemsize  # (copies: a gathered row may sit unaligned)
        return buffer[cut:].clone().view(self._index_dtype), buffer[:cut].clone().view(dtype)

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if self._buffers:  # BatchNorm's statistics: every worker keeps their mean
            assign(self._buffers, average(self._buffers, ctx.transport))

    def close(self) -> None:
        self._tensors = []
