"""Quantizing codecs: every element is sent, in fewer bits; payloads have a fixed size.

- `fp16`, `bf16`: half-precision values (exactly half the bytes of fp32).
- `onebit`: 1-bit SGD (Seide et al. 2014): one bit per element, its sign, decoded as the mean
  of the non-negative or of the negative elements of its bucket (Seide keeps a pair per
  matrix column; a bucket of `bucket` elements plays that role in a flat tensor); error
  feedback carries the rest over.
- `sign`: scaled sign, EF-signSGD (Karimireddy et al. 2019): sign bits times ||x||_1 / d,
  d the size of the element's bucket.
- `qsgd`: in qsgd.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fastsgd.compress import kernels
from fastsgd.compress.base import Codec, Payload
from fastsgd.compress.bits import (
    block_rows,
    blocks,
    by_bucket,
    by_bucket_rows,
    pack_bits,
    pack_flag_rows,
    unpack_flag_rows,
    unpack_flags,
)
from fastsgd.config.options import Option, at_least


class Cast(Codec):
    """Values cast to a 16-bit float type."""

    FIELDS = ["values"]

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def compress(self, tensor: torch.Tensor) -> Payload:
        return {"values": tensor.reshape(-1).to(self.dtype)}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return payload["values"].to(like.dtype).view_as(like)

    def encode_rows(self, chunks: torch.Tensor, states: list[dict[str, Any]]) -> Payload:
        """As OneBit.encode_rows (a cast keeps no state)."""
        return {"values": chunks.detach().to(self.dtype)}

    def decode_rows(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        """As OneBit.decode_rows."""
        return payload["values"].to(like.dtype)


class FP16(Cast):
    name = "fp16"

    def __init__(self):
        super().__init__(torch.float16)


class BF16(Cast):
    name = "bf16"

    def __init__(self):
        super().__init__(torch.bfloat16)


EF_OPTION = {"error_feedback": Option(bool, True, doc="carry what was not sent to the next")}
RUN = 1 << 18  # elements encoded at a time (1 MB of fp32): their temporaries stay in cache


def encode_in_runs(flat: torch.Tensor, state: dict[str, Any], bucket: int,
                   encode: Callable[[torch.Tensor], Payload]) -> Payload:
    """Error feedback over runs of whole buckets, `encode(target)` giving a run's payload
    and leaving in `target` what it did not send. Buckets are encoded on their own and a
    run of whole bytes of flags packs alone, so payload and residual are those of one pass
    over the tensor, without its tensor-sized temporaries: out of cache, at 16 MB, they
    cost page faults (onebit 1.1 GB/s against 2.0 at 1 MB, docs/compression.md)."""
    step = math.lcm(bucket, 8) * max(1, RUN // math.lcm(bucket, 8))
    residual = state["residual"]
    # one run: short tensors, and on a GPU, where a run's kernel launches would cost more
    # than the cache saves
    if flat.numel() <= step or flat.device.type != "cpu":
        target = flat + residual
        payload = encode(target)
        state["residual"] = target
        return payload
    parts = []
    for start in range(0, flat.numel(), step):  # each run of the residual becomes its target
        parts.append(encode(residual[start:start + step].add_(flat[start:start + step])))
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


class OneBit(Codec):
    name = "onebit"
    FIELDS = ["bits", "means"]
    # 256: momentum SGD's updates vary widely in magnitude inside a bucket; at 2048 onebit
    # lost 2.8 points to no compression at the synchronous settings, at 256 0.85 (1.25 bits
    # an element; docs/compression.md, "Momentum correction")
    OPTIONS = {**EF_OPTION, "bucket": Option(int, 256, at_least(1), "elements per mean pair")}

    def __init__(self, error_feedback: bool = True, bucket: int = 256):
        self.error_feedback, self.bucket = error_feedback, bucket

    def compress(self, tensor: torch.Tensor) -> Payload:
        return self._compress(tensor)[0]

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        """`Codec.encode`, with the residual taken from the bits and means at hand rather
        than from a decode of the packed payload (the same numbers)."""
        flat = tensor.detach().reshape(-1)
        if not self.error_feedback:
            return self.compress(flat)
        return encode_in_runs(flat, state, self.bucket, self._encode_run)

    def _encode_run(self, target: torch.Tensor) -> Payload:
        if kernels.usable(target):
            return self._encode_run_loop(target)
        payload, positive = self._compress(target)
        means = payload["means"].to(target.dtype).view(-1, 2)  # as decode reads them
        target.sub_(by_bucket(positive.view(-1)[:target.numel()], means[:, 0], means[:, 1],
                              self.bucket))
        return payload

    def _encode_run_loop(self, target: torch.Tensor) -> Payload:
        """_encode_run with the counts, the bits and the residual from compiled loops (the
        same numbers): 2-3x faster on the CPU (docs/compression.md)."""
        n, size = target.numel(), self.bucket
        rows = target.view(-1, size) if n % size == 0 else blocks(target, size)
        count = torch.empty(rows.shape[0], dtype=torch.int32)
        kernels.loops().count_nonnegative(target.numpy(), size, count.numpy())
        means = self._means(rows, count, n)
        bits = torch.empty(-(-n // 8), dtype=torch.uint8)
        pair = means.view(-1, 2).T.contiguous()
        kernels.loops().subtract_by_sign(target.numpy(), pair[0].numpy(), pair[1].numpy(), size,
                                         bits.numpy())
        return {"bits": bits, "means": means}

    def _compress(self, tensor: torch.Tensor):
        """The payload and the signs as (buckets, bucket), the padding False."""
        x = tensor.reshape(-1)
        n, size = x.numel(), self.bucket
        rows = x.view(-1, size) if n % size == 0 else blocks(x, size)
        positive = rows >= 0
        if rows.numel() > n:
            positive[-1, n - rows.numel():] = False
        count = positive.view(torch.uint8).sum(1, dtype=torch.int32)  # int64: 30x slower
        means = self._means(rows, count, n)
        bits = pack_bits(positive.view(-1)[:n])
        return {"bits": bits, "means": means}, positive

    def encode_rows(self, chunks: torch.Tensor, states: list[dict[str, Any]]) -> Payload:
        """`encode` of each row of chunks (n, m) with its own state, all at once: the
        payloads' fields stacked as rows, row r's payload and residual those of
        encode(chunks[r], states[r]), bit for bit (the chunks a compressed reduce-scatter
        sends, one per worker)."""
        target = self.targets(chunks, states)
        (n, m), size = target.shape, self.bucket
        rows = block_rows(target, size)
        positive = (rows >= 0).view(n, -1)
        positive[:, m:] = False
        count = positive.view(rows.shape).view(torch.uint8).sum(1, dtype=torch.int32)
        means = self._means(rows, count, m, chunks=n).view(n, -1)
        positive = positive[:, :m]
        if self.error_feedback:
            pairs = means.to(target.dtype).view(n, -1, 2)  # as decode reads them
            target.sub_(by_bucket_rows(positive, pairs[..., 0], pairs[..., 1], size))
            for state, residual in zip(states, target):
                state["residual"] = residual
        return {"bits": pack_flag_rows(positive), "means": means}

    def _means(self, rows: torch.Tensor, count: torch.Tensor, n: int,
               chunks: int = 1) -> torch.Tensor:
        """The (non-negative, negative) mean pairs of the buckets (rows, the last padded
        with zeros) of n elements, `count` of each non-negative (int32); with `chunks`, the
        rows are that many tensors' buckets, one after the other, each of n elements."""
        size = self.bucket
        real = torch.full_like(count, size)
        if real.numel():  # (an empty tensor has no bucket)
            real.view(chunks, -1)[:, -1] = n - (rows.shape[0] // chunks - 1) * size
        # (rows * positive).sum(1): clamping adds up the same nonzero terms in the same
        # order, so only the sign of a zero sum can differ: those rows are summed as before
        # (the padding adds +0 either way)
        high, low = rows.clamp_min(0).sum(1), rows.clamp_max(0).sum(1)
        zero = ((high == 0) | (low == 0)).nonzero().view(-1)
        if zero.numel():
            some = rows[zero]
            positive = some >= 0
            high[zero] = (some * positive).sum(1)
            low[zero] = (some * ~positive).sum(1)
        high /= count.clamp_min(1)
        low /= (real - count).clamp_min(1)
        return torch.stack([high, low], 1).float().reshape(-1)

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        means = payload["means"].to(like.dtype).view(-1, 2)
        positive = unpack_flags(payload["bits"], like.numel())
        return by_bucket(positive, means[:, 0], means[:, 1], self.bucket).view_as(like)

    def decode_rows(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        """Payloads of like's size whose fields are stacked as rows: (n, like.numel()), row
        r the decode of payload r, bit for bit."""
        n = payload["bits"].shape[0]
        means = payload["means"].to(like.dtype).view(n, -1, 2)
        positive = unpack_flag_rows(payload["bits"], like.numel())
        return by_bucket_rows(positive, means[..., 0], means[..., 1], self.bucket)


class Sign(Codec):
    name = "sign"
    FIELDS = ["bits", "scales"]
    # 512: at the synchronous momentum settings 1.2 points below no compression, 2.0 at 2048
    # (1.06 bits an element; docs/compression.md, "Momentum correction")
    OPTIONS = {**EF_OPTION, "bucket": Option(int, 512, at_least(1), "elements per scale")}

    def __init__(self, error_feedback: bool = True, bucket: int = 512):
        self.error_feedback, self.bucket = error_feedback, bucket

    def compress(self, tensor: torch.Tensor) -> Payload:
        return self._compress(tensor)[0]

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        """`Codec.encode`, the residual taken from the signs and scales at hand."""
        flat = tensor.detach().reshape(-1)
        if not self.error_feedback:
            return self.compress(flat)
        return encode_in_runs(flat, state, self.bucket, self._encode_run)

    def _encode_run(self, target: torch.Tensor) -> Payload:
        if kernels.usable(target):  # bits and residual from a compiled loop, same numbers
            scales = self._scales(target)
            bits = torch.empty(-(-target.numel() // 8), dtype=torch.uint8)
            kernels.loops().subtract_by_sign(target.numpy(), scales.numpy(), (-scales).numpy(),
                                             self.bucket, bits.numpy())
            return {"bits": bits, "scales": scales}
        payload, positive, scales = self._compress(target)
        scale = scales.to(target.dtype)
        target.sub_(by_bucket(positive, scale, -scale, self.bucket))
        return payload

    def _compress(self, tensor: torch.Tensor):
        x = tensor.reshape(-1)
        positive = x >= 0
        scales = self._scales(x)
        return {"bits": pack_bits(positive), "scales": scales}, positive, scales

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        """||bucket||_1 / its size, per bucket of the flat x (float32)."""
        n, size = x.numel(), self.bucket
        full = n // size
        sums = x[:full * size].view(full, size).abs().sum(1)
        if n > full * size:  # the last bucket, padded with zeros, is short
            last = blocks(x[full * size:], size).abs().sum(1)
            sums = torch.cat([sums, last])
        sizes = torch.full_like(sums, float(size))
        if n > full * size:
            sizes[-1] = n - full * size
        return (sums / sizes).float()

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        positive = unpack_flags(payload["bits"], like.numel())
        scale = payload["scales"].to(like.dtype)
        return by_bucket(positive, scale, -scale, self.bucket).view_as(like)

    def encode_rows(self, chunks: torch.Tensor, states: list[dict[str, Any]]) -> Payload:
        """As OneBit.encode_rows."""
        target = self.targets(chunks, states)
        (n, m), size = target.shape, self.bucket
        sums = block_rows(target, size).abs().sum(1).view(n, -1)
        sizes = torch.full_like(sums, float(size))
        sizes[:, -1] = m - (sums.shape[1] - 1) * size
        scales = (sums / sizes).float()
        positive = target >= 0
        if self.error_feedback:
            scale = scales.to(target.dtype)
            target.sub_(by_bucket_rows(positive, scale, -scale, size))
            for state, residual in zip(states, target):
                state["residual"] = residual
        return {"bits": pack_flag_rows(positive), "scales": scales}

    def decode_rows(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        """As OneBit.decode_rows."""
        positive = unpack_flag_rows(payload["bits"], like.numel())
        scale = payload["scales"].to(like.dtype).view(positive.shape[0], -1)
        return by_bucket_rows(positive, scale, -scale, self.bucket)
