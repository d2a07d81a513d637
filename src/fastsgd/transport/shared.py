"""Memory every worker on one machine maps: Hogwild's lock-free shared parameters."""

from __future__ import annotations

import os

import torch

from fastsgd.errors import UserError


def shared_tensor(transport, name: str, like: torch.Tensor) -> torch.Tensor:
    """Collective: a tensor in this machine's shared memory, the same for every worker,
    starting as rank 0's `like`."""
    if transport.device.type != "cpu":
        raise UserError("shared memory is host memory, and run.backend = 'nccl' keeps the "
                        "model on the GPU: use run.backend = 'gloo'")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", transport.world_size))
    if local != transport.world_size:
        raise UserError(f"shared memory needs every worker on one machine: {local} of "
                        f"{transport.world_size} are on this one")
    job = os.environ.get("MASTER_PORT", "0")
    path = f"/dev/shm/fastsgd-{job}-{name}"
    if transport.rank == 0:
        shared = torch.from_file(path, shared=True, size=like.numel(), dtype=like.dtype)
        shared.copy_(like.reshape(-1))
    transport.barrier()
    if transport.rank != 0:
        shared = torch.from_file(path, shared=True, size=like.numel(), dtype=like.dtype)
    transport.barrier()
    if transport.rank == 0:
        os.unlink(path)  # the mappings stay valid; nothing is left behind
    return shared
