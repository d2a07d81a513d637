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

from collections.abc import Sequence
from typing import Any

import torch

from fastsgd.compress.base import Compressor
from fastsgd.compress.wire import pack, pack_rows, unpack, unpack_rows
from fastsgd.transport.base import Transport


def init_all_reduce(codec: Compressor, like: torch.Tensor, world_size: int) -> dict[str, Any]:
    """The codec state of one all-reduced tensor (e.g. one gradient bucket). `like` may
    have its parameter's shape, which PowerSGD factors (the others see it flat)."""
    if codec.kind == "lowrank":
        return codec.init(like)
    if codec.kind != "quantize":
        return codec.init(like.reshape(-1))
    chunk = _chunks(like.reshape(-1), world_size)[0]
    return {"scatter": [codec.init(chunk) for _ in range(world_size)],
            "gather": codec.init(chunk)}


def unsent(codec: Compressor, state: dict[str, Any], like: torch.Tensor) -> torch.Tensor | None:
    """What of this worker's own tensor its codec has held back so far (flat, like's size):
    the error-feedback residual of its encode, or of its chunks' encodes in a compressed
    reduce-scatter; None where the codec keeps none. (The residual of a reduced chunk's
    re-encode in the all-gather belongs to the mean, not to this worker, and so does
    PowerSGD's: the worker's matrix less the group's approximation.)"""
    held_back = getattr(codec, "held_back", None)
    if held_back is None or codec.kind == "lowrank":
        return None
    if codec.kind == "quantize":
        parts = [held_back(s) for s in state["scatter"]]
        # `is`, not `None in parts`: that compares each tensor with None, which torch
        # answers through a TypeError (0.13 ms a tensor; a fifth of a 1-bit SGD step)
        if any(part is None for part in parts):
            return None
        return torch.cat(parts)[:like.numel()]
    return held_back(state)


def all_reduce_mean(tensor: torch.Tensor, codec: Compressor, state: dict[str, Any],
                    transport: Transport) -> torch.Tensor:
    """The mean over workers of `tensor`, moved in the codec's compressed form; every worker
    gets the same result."""
    return all_reduce_means([tensor], codec, [state], transport)[0]


def all_reduce_means(tensors: list[torch.Tensor], codec: Compressor,
                     states: list[dict[str, Any]], transport: Transport) -> list[torch.Tensor]:
    """`all_reduce_mean` of several tensors (layers), each encoded on its own (its own scale,
    its own residual) but all moved together: one message per peer and stage rather than one
    per tensor, since each message has a fixed cost."""
    n = transport.world_size
    if codec.kind == "exact":
        outs = [t.detach().clone() for t in tensors]
        for out in outs:
            transport.all_reduce(out)
        return [out.div_(n) for out in outs]
    if codec.kind == "lowrank":
        return [codec.all_reduce(t, s, transport)  # type: ignore[attr-defined]
                for t, s in zip(tensors, states)]
    if codec.kind == "sparse":  # payload sizes follow from numel and ratio: alike everywhere
        parts = [pack(codec.encode(t, s)) for t, s in zip(tensors, states)]
        gathered = transport.all_gather(torch.cat(parts))
        return _decode_sum(codec, tensors, [_split(g, parts) for g in gathered], range(n))
    return _scatter_gather(tensors, codec, states, transport)


def _scatter_gather(tensors: list[torch.Tensor], codec: Compressor,
                    states: list[dict[str, Any]], t: Transport) -> list[torch.Tensor]:
    n, me = t.world_size, t.rank
    chunks = [_chunks(x.detach().reshape(-1), n) for x in tensors]
    mine = [c[me] for c in chunks]
    parts = [_encoded(codec, cs, state["scatter"])
             for cs, state in zip(chunks, states)]  # parts[tensor][destination]
    outgoing = [torch.cat([p[j] for p in parts]) for j in range(n)]
    peers = [j for j in range(n) if j != me]
    # chunk payloads: one size
    came = t.exchange([(j, outgoing[j]) for j in peers], peers, outgoing[me])
    received = [_split(b, [p[me] for p in parts]) for b in [outgoing[me], *map(came.get, peers)]]
    reduced = _decode_sum(codec, mine, received, [me, *peers])
    parts = [pack(codec.encode(r, state["gather"])) for r, state in zip(reduced, states)]
    gathered = [_split(g, parts) for g in t.all_gather(torch.cat(parts))]
    return [_joined(_decoded(codec, [g[i] for g in gathered], mine[i], range(n))
                    )[:x.numel()].view_as(x) for i, x in enumerate(tensors)]


def _encoded(codec: Compressor, chunks: torch.Tensor,
             states: list[dict[str, Any]]) -> Sequence[torch.Tensor]:
    """Each chunk (a row of `chunks`) encoded with its own state and packed, in order: the
    rows of one tensor where the codec encodes them at once (`encode_rows`, the same
    bits)."""
    rows = getattr(codec, "encode_rows", None)
    payload = rows(chunks, states) if rows is not None and len(chunks) > 1 \
        and chunks.shape[1] > 0 else None
    if payload is None:  # (the codec may decline: QSGD on a GPU)
        return [pack(codec.encode(c, s)) for c, s in zip(chunks, states)]
    return pack_rows(payload)


def _decode_sum(codec: Compressor, likes: list[torch.Tensor],
                buffers: list[list[torch.Tensor]], senders: Sequence[int]) -> list[torch.Tensor]:
    """For each tensor i: the mean over sources of buffers[source][i], decoded, summed in
    the sources' order (`senders`: their ranks)."""
    return [sum(_decoded(codec, [b[i] for b in buffers], like, senders)) / len(buffers)
            for i, like in enumerate(likes)]


def _decoded(codec: Compressor, buffers: list[torch.Tensor], like: torch.Tensor,
             senders: Sequence[int]) -> Sequence[torch.Tensor]:
    """Each of `buffers` (payloads of like's size, from `senders`) decoded, in order: the rows
    of one tensor where the codec decodes many at once (`decode_rows`, the same bits), in a
    few calls where one by one took a dozen each, per worker and tensor (at 64 simulated
    workers, 1-bit SGD's all-reduce decoded 768 payloads per worker-step)."""
    rows = getattr(codec, "decode_rows", None)
    if rows is not None and len(buffers) > 1:
        payload = unpack_rows(buffers, codec.FIELDS, senders[0])
        if payload is not None:
            return rows(payload, like)
    return [decode_buffer(codec, b, like, src) for b, src in zip(buffers, senders)]


def _joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return parts.reshape(-1) if isinstance(parts, torch.Tensor) else torch.cat(list(parts))


def _split(buffer: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """`buffer` cut into pieces the sizes of `like`'s buffers."""
    return list(buffer.split([len(b) for b in like]))


def _chunks(flat: torch.Tensor, n: int) -> torch.Tensor:
    """`flat` zero-padded and cut into n chunks of one size: the rows of the result."""
    size = -(-flat.numel() // n)
    padded = torch.zeros(size * n, dtype=flat.dtype, device=flat.device)
    padded[:flat.numel()] = flat
    return padded.view(n, size)


def decode_buffer(codec: Compressor, buffer: torch.Tensor, like: torch.Tensor,
                  src: int) -> torch.Tensor:
    """The tensor a packed payload from worker `src` stands for."""
    return codec.decode(unpack(buffer, codec.FIELDS, src), like)
