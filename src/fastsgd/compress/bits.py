"""Bit packing: small unsigned integers stored `width` bits each, 8 bits to a byte.

A value of `width` bits is split into `width` bit planes, each packed 8 to a byte, so any
width costs exactly ceil(n / 8) bytes per plane and needs no cross-byte arithmetic.
"""

from __future__ import annotations

import torch

_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def pack_bits(values: torch.Tensor, width: int = 1) -> torch.Tensor:
    """Pack the low `width` bits of each integer of `values` (1-D) into uint8 bytes."""
    n = values.numel()
    padded = torch.zeros(width, (n + 7) // 8 * 8, dtype=torch.uint8, device=values.device)
    v = values.reshape(-1).to(torch.int64)
    for plane in range(width):
        padded[plane, :n] = ((v >> plane) & 1).to(torch.uint8)
    weights = _WEIGHTS.to(values.device)
    return (padded.view(width, -1, 8) * weights).sum(-1, dtype=torch.uint8).reshape(-1)


def unpack_bits(packed: torch.Tensor, n: int, width: int = 1) -> torch.Tensor:
    """The `n` integers (int64) that `pack_bits(values, width)` packed into `packed`."""
    weights = _WEIGHTS.to(packed.device)
    planes = (packed.view(width, -1, 1) & weights).ne(0).reshape(width, -1)[:, :n]
    shifts = torch.arange(width, device=packed.device).view(-1, 1)
    return (planes.to(torch.int64) << shifts).sum(0)
