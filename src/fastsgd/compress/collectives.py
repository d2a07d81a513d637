"""Collectives on compressed payloads: what an all-reduce becomes for each kind of codec.

Network bytes one worker sends for an S-byte tensor among n workers (the docs' table):
- exact (`none`): ring all-reduce, 2(n-1)/n * S;
- quantize: a compressed reduce-scatter (chunk j of every worker's tensor, encoded, goes to
  worker j: (n-1) chunk payloads) then a compressed all-gather of the reduced chunks (again
  (n-1) chunk payloads): 2(n-1)/n * S / factor, error feedback at both stages as in 1-bit
  Adam (Tang et al. 2021);
- sparse: every worker's payload s gathered to all, (n-1) * s, then decoded and added;
- lowrank (PowerSGD): two ring all-reduces of the factors.
"""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.compress.base import Compressor
from fastsgd.compress.wire import pack, unpack
from fastsgd.transport.base import Transport


def init_all_reduce(codec: Compressor, like: torch.Tensor, world_size: int) -> dict[str, Any]:
    """The codec state of one all-reduced tensor (e.g. one gradient bucket)."""
    if codec.kind != "quantize":
        return codec.init(like)
    chunk = _chunks(like.reshape(-1), world_size)[0]
    return {"scatter": [codec.init(chunk) for _ in range(world_size)],
            "gather": codec.init(chunk)}


def all_reduce_mean(tensor: torch.Tensor, codec: Compressor, state: dict[str, Any],
                    transport: Transport) -> torch.Tensor:
    """The mean over workers of `tensor`, moved in the codec's compressed form; every worker
    gets the same result."""
    n = transport.world_size
    if codec.kind == "exact":
        out = tensor.detach().clone()
        transport.all_reduce(out)
        return out.div_(n)
    if codec.kind == "lowrank":
        return codec.all_reduce(tensor, state, transport)  # type: ignore[attr-defined]
    if codec.kind == "sparse":
        buffers = transport.all_gather(pack(codec.encode(tensor, state)))
        return sum(decode_buffer(codec, b, tensor, src) for src, b in enumerate(buffers)) / n
    return _scatter_gather(tensor, codec, state, transport)


def _scatter_gather(tensor: torch.Tensor, codec: Compressor, state: dict[str, Any],
                    t: Transport) -> torch.Tensor:
    n, me = t.world_size, t.rank
    chunks = _chunks(tensor.detach().reshape(-1), n)
    buffers = [pack(codec.encode(c, s)) for c, s in zip(chunks, state["scatter"])]
    handles = [t.send(buffers[j], j) for j in range(n) if j != me]
    reduced = codec.decode(unpack(buffers[me], codec.FIELDS, me), chunks[me]).clone()
    for src in (j for j in range(n) if j != me):
        received = torch.empty_like(buffers[src])  # chunk payloads all have the same size
        t.recv(received, src)
        reduced += decode_buffer(codec, received, chunks[me], src)
    for handle in handles:
        handle.wait()
    gathered = t.all_gather(pack(codec.encode(reduced / n, state["gather"])))
    out = torch.cat([decode_buffer(codec, b, chunks[me], src) for src, b in enumerate(gathered)])
    return out[:tensor.numel()].view_as(tensor)


def _chunks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    size = -(-flat.numel() // n)
    padded = torch.zeros(size * n, dtype=flat.dtype, device=flat.device)
    padded[:flat.numel()] = flat
    return list(padded.view(n, size))


def decode_buffer(codec: Compressor, buffer: torch.Tensor, like: torch.Tensor,
                  src: int) -> torch.Tensor:
    """The tensor a packed payload from worker `src` stands for."""
    return codec.decode(unpack(buffer, codec.FIELDS, src), like)
