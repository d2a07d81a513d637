"""Flat views of a parameter list, shared by the strategies that move whole models."""

from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector


def flatten(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """A new 1-D tensor holding all parameters (a copy, safe to send)."""
    return parameters_to_vector([p.detach() for p in params])


def assign(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy a flat vector into the parameters (they keep their own storage)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def average(params: list[torch.nn.Parameter], transport) -> torch.Tensor:
    """The mean of every worker's parameters (one all-reduce), as a flat vector."""
    flat = flatten(params)
    transport.all_reduce(flat)
    return flat.div_(transport.world_size)
