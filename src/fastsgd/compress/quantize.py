"""Quantizing codecs: every element is sent, in fewer bits; payloads have a fixed size.

- `fp16`, `bf16`: half-precision values (exactly half the bytes of fp32).
- `onebit`: 1-bit SGD (Seide et al. 2014): one bit per element, its sign, decoded as the mean
  of the non-negative or of the negative elements of its bucket (Seide keeps a pair per
  matrix column; a bucket of `bucket` elements plays that role in a flat tensor); error
  feedback carries the rest over.
- `sign`: scaled sign, EF-signSGD (Karimireddy et al. 2019): sign bits times ||x||_1 / d,
  d the size of the element's bucket.
- `qsgd`: QSGD (Alistarh et al. 2017): |x_i| / ||x||_2 stochastically rounded to one of
  `levels` levels, so the decoded tensor is an unbiased estimate of x; sign and level are
  packed into ceil(log2(2 levels + 1)) bits. As in the paper, norms are taken over buckets
  of `bucket` elements (one float each), which bounds the variance by the bucket's size.
"""

from __future__ import annotations

import torch

from fastsgd.compress.base import Codec, Payload
from fastsgd.compress.bits import pack_bits, unpack_bits
from fastsgd.options import Option, at_least


class Cast(Codec):
    """Values cast to a 16-bit float type."""

    FIELDS = ["values"]

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def compress(self, tensor: torch.Tensor) -> Payload:
        return {"values": tensor.reshape(-1).to(self.dtype)}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return payload["values"].to(like.dtype).view_as(like)


class FP16(Cast):
    name = "fp16"

    def __init__(self):
        super().__init__(torch.float16)


class BF16(Cast):
    name = "bf16"

    def __init__(self):
        super().__init__(torch.bfloat16)


EF_OPTION = {"error_feedback": Option(bool, True, doc="carry what was not sent to the next")}


class OneBit(Codec):
    name = "onebit"
    FIELDS = ["bits", "means"]
    OPTIONS = {**EF_OPTION, "bucket": Option(int, 2048, at_least(1), "elements per mean pair")}

    def __init__(self, error_feedback: bool = True, bucket: int = 2048):
        self.error_feedback, self.bucket = error_feedback, bucket

    def compress(self, tensor: torch.Tensor) -> Payload:
        rows = blocks(tensor, self.bucket)
        real = blocks(torch.ones_like(tensor.reshape(-1), dtype=torch.bool), self.bucket)
        positive = rows >= 0
        negative = ~positive & real  # the last bucket's padding belongs to neither mean
        positive &= real
        high = (rows * positive).sum(1) / positive.sum(1).clamp_min(1)
        low = (rows * negative).sum(1) / negative.sum(1).clamp_min(1)
        bits = positive.reshape(-1)[:tensor.numel()]
        return {"bits": pack_bits(bits), "means": torch.stack([high, low], 1).float().reshape(-1)}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        positive = unpack_bits(payload["bits"], like.numel()).bool()
        means = payload["means"].to(like.dtype).view(-1, 2).repeat_interleave(self.bucket, 0)
        means = means[:like.numel()]
        return torch.where(positive, means[:, 0], means[:, 1]).view_as(like)


class Sign(Codec):
    name = "sign"
    FIELDS = ["bits", "scales"]
    OPTIONS = {**EF_OPTION, "bucket": Option(int, 2048, at_least(1), "elements per scale")}

    def __init__(self, error_feedback: bool = True, bucket: int = 2048):
        self.error_feedback, self.bucket = error_feedback, bucket

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = tensor.reshape(-1)
        rows = blocks(x, self.bucket)
        last = x.numel() - (rows.shape[0] - 1) * self.bucket  # the last bucket may be short
        sizes = torch.full((rows.shape[0],), float(self.bucket), dtype=x.dtype, device=x.device)
        sizes[-1] = last
        return {"bits": pack_bits(x >= 0), "scales": (rows.abs().sum(1) / sizes).float()}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        positive = unpack_bits(payload["bits"], like.numel()).bool()
        scale = payload["scales"].to(like.dtype).repeat_interleave(self.bucket)[:like.numel()]
        return torch.where(positive, scale, -scale).view_as(like)


class QSGD(Codec):
    name = "qsgd"
    FIELDS = ["norms", "levels"]
    OPTIONS = {"levels": Option(int, 15, at_least(1), "quantization levels s"),
               "bucket": Option(int, 512, at_least(1), "elements sharing one norm"),
               "error_feedback": Option(bool, False, doc="QSGD is unbiased without it")}

    def __init__(self, levels: int = 15, bucket: int = 512, error_feedback: bool = False):
        self.levels, self.bucket, self.error_feedback = levels, bucket, error_feedback
        self.width = (2 * levels).bit_length()  # signed level + levels fits in [0, 2 levels]

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = tensor.reshape(-1)
        rows = blocks(x, self.bucket)
        norms = rows.norm(dim=1, keepdim=True).float()
        tiny = torch.finfo(torch.float32).tiny
        scaled = (rows.abs() / norms.clamp_min(tiny) * self.levels).reshape(-1)[:x.numel()]
        lower = scaled.floor()
        level = lower + (torch.rand_like(scaled) < scaled - lower).to(scaled.dtype)
        signed = (torch.sign(x) * level).to(torch.int64) + self.levels
        return {"norms": norms.reshape(-1), "levels": pack_bits(signed, self.width)}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        signed = unpack_bits(payload["levels"], like.numel(), self.width) - self.levels
        scale = payload["norms"].to(like.dtype).repeat_interleave(self.bucket) / self.levels
        return (signed.to(like.dtype) * scale[:like.numel()]).view_as(like)


def blocks(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """The elements of `tensor` as rows of `size` (the last one padded with zeros)."""
    x = tensor.reshape(-1)
    padded = x.new_zeros(-(-x.numel() // size) * size)
    padded[:x.numel()] = x
    return padded.view(-1, size)
