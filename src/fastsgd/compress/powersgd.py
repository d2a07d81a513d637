"""PowerSGD (Vogels, Karimireddy & Jaggi 2019): rank-`rank` approximation of the gradient by
one step of power iteration, warm-started from the previous step's factor, with error
feedback. Two all-reduces per message (of P = M Q, then of Q = M^T P), so it is not a
payload codec: it lives where an all-reduce is (`kind = "lowrank"`, see collectives.py).

Each tensor is approximated as the paper does (Section 3): a layer's weight of shape
(out, ...) as the matrix (out, prod(...)), whose gradient is low-rank (a sum of one outer
product per sample); a flat tensor (a bucket of several layers, a pseudo-gradient) as a
near-square matrix, padded with zeros. (rows + cols) * rank floats cross the wire instead of
rows * cols; a tensor the factors would not shrink (a bias, a small layer) is all-reduced
whole, as the paper does for vectors.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fastsgd.compress import kernels
from fastsgd.compress.base import Codec, Payload
from fastsgd.config.options import Option, at_least
from fastsgd.errors import UserError
from fastsgd.transport.base import Transport


def shape_of(numel: int) -> tuple[int, int]:
    """The near-square matrix a flat tensor of `numel` elements is viewed as."""
    rows = max(1, math.isqrt(numel - 1) + 1 if numel > 1 else 1)
    return rows, -(-numel // rows)


def matrix_shape(like: torch.Tensor) -> tuple[int, int]:
    """(out, prod(rest)) for a tensor of two or more dimensions, else near-square."""
    if like.dim() >= 2 and like.shape[0] > 0:
        return like.shape[0], like.numel() // like.shape[0]
    return shape_of(like.numel())


def products(matrix: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """matrix @ factor (contiguous), for a tall or wide matrix and a factor of a few columns,
    computed as (factor^T matrix^T)^T: BLAS streams the big matrix once with the few rows of
    factor^T at hand, where matrix @ factor ran 3-25x slower on the CPU (MKL, one thread;
    docs/compression.md). The same products, summed in another order."""
    return (factor.T @ matrix.T).T.contiguous()


def orthonormal(p: torch.Tensor) -> torch.Tensor:
    """Q of p's QR decomposition: orthonormal columns spanning p's. torch has no QR for
    float16 and bfloat16 (geqrf), so a model of those has it done in float32 and cast back:
    every half value is exact in float32, and the Q is rounded once, as a half QR would."""
    if p.dtype in (torch.float32, torch.float64):
        return torch.linalg.qr(p).Q
    return torch.linalg.qr(p.float()).Q.to(p.dtype)


class PowerSGD(Codec):
    name = "powersgd"
    kind = "lowrank"
    FIELDS = ["p", "q"]
    OPTIONS = {"rank": Option(int, 8, at_least(1), "rank of the approximation"),
               "seed": Option(int, 0, doc="seed of the first Q (the same on every worker)")}
    error_feedback = True

    def __init__(self, rank: int = 8, seed: int = 0):
        self.rank, self.seed = rank, seed

    def init(self, like: torch.Tensor) -> dict[str, Any]:
        """`like` in its own shape (see matrix_shape); the state has no factor `q` where the
        factors would not be smaller than the tensor (nor a residual: it is sent whole)."""
        rows, cols = matrix_shape(like)
        rank = min(self.rank, rows, cols)
        if (rows + cols) * rank >= rows * cols:
            return {}
        generator = torch.Generator().manual_seed(self.seed)
        q = torch.randn(cols, rank, generator=generator)
        return {**super().init(like.reshape(-1)), "q": q.to(like.device, like.dtype)}

    def all_reduce(self, tensor: torch.Tensor, state: dict[str, Any],
                   transport: Transport) -> torch.Tensor:
        """The mean over workers of the rank-r approximation of tensor + residual."""
        if "q" not in state:  # not worth factoring: the exact mean
            mean = tensor.detach().clone()
            transport.all_reduce(mean)
            return mean.div_(transport.world_size)
        flat = state["residual"].add_(tensor.detach().reshape(-1))  # the residual, in place
        cols = state["q"].shape[0]
        rows = -(-flat.numel() // cols)
        if rows * cols == flat.numel():  # a square or near-square size: no padding
            matrix = flat.view(rows, cols)
        else:
            matrix = torch.zeros(rows * cols, dtype=flat.dtype, device=flat.device)
            matrix[:flat.numel()] = flat
            matrix = matrix.view(rows, cols)
        p = products(matrix, state["q"])
        transport.all_reduce(p)
        p = orthonormal(p)  # the scale of the mean does not matter
        q = products(matrix.T, p)
        transport.all_reduce(q)
        q /= transport.world_size
        state["q"] = q
        approximation = kernels.low_rank(p, q, flat)  # flat is the residual now
        state["residual"] = flat  # as torch's powerSGD_hook: against the mean's approximation
        return approximation.view_as(tensor)

    def compress(self, tensor: torch.Tensor) -> Payload:
        raise UserError("compression.name = 'powersgd' needs an all-reduce of its factors; "
                        "this strategy sends point-to-point messages: choose another codec")

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return (payload["p"] @ payload["q"].T).reshape(-1)[:like.numel()].view_as(like)
