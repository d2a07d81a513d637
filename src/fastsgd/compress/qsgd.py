"""QSGD (Alistarh et al. 2017): |x_i| / ||x||_2 stochastically rounded to one of `levels`
levels, so the decoded tensor is an unbiased estimate of x; sign and level are packed into
ceil(log2(2 levels + 1)) bits. As in the paper, norms are taken over buckets of `bucket`
elements (one float each), which bounds the variance by the bucket's size.
"""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.compress import kernels
from fastsgd.compress.base import Codec, Payload
from fastsgd.compress.bits import block_rows, blocks, pack_bits, unpack_bits, unpack_bytes
from fastsgd.config.options import Option, at_least


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
        rows, norms = self._norms(x)
        if self.width <= 8 and kernels.usable(x) and kernels.may_draw() \
                and bool(norms.isfinite().all()):
            with kernels.DRAWS:  # one compress at a time draws from torch's generator
                if _fast_qsgd_ok():
                    return self._compress_loop(x, norms)
        return self._compress_torch(x, rows, norms)

    def _norms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The buckets of x as rows (the last padded with zeros) and their norms (float32)."""
        size = self.bucket
        rows = x.view(-1, size) if x.numel() % size == 0 else blocks(x, size)
        return rows, rows.norm(dim=1, keepdim=True).float()

    def _compress_loop(self, x: torch.Tensor, norms: torch.Tensor) -> Payload:
        tiny = torch.finfo(torch.float32).tiny
        levels = kernels.qsgd_planes(x, norms.clamp_min(tiny).view(-1), self.levels,
                                     self.bucket, self.width)
        return {"norms": norms.reshape(-1), "levels": levels}

    def _compress_torch(self, x: torch.Tensor, rows: torch.Tensor,
                        norms: torch.Tensor) -> Payload:
        levels = self._level_rows(x.view(1, -1), rows, norms)
        return {"norms": norms.reshape(-1), "levels": levels.view(-1)}

    def _level_rows(self, x: torch.Tensor, rows: torch.Tensor,
                    norms: torch.Tensor) -> torch.Tensor:
        """The packed levels of each row of x (n, m), whose buckets are `rows` with their
        `norms`: (n, width planes of ceil(m / 8) bytes), drawing n * m numbers in order."""
        (n, m), tiny = x.shape, torch.finfo(torch.float32).tiny
        scaled = rows.abs()
        scaled = scaled.div_(norms.clamp_min(tiny)) if scaled.dtype == norms.dtype else \
            scaled / norms.clamp_min(tiny)
        scaled = scaled.mul_(self.levels).view(n, -1)[:, :m].contiguous()
        level = scaled.floor()
        with kernels.DRAWS:
            up = torch.rand_like(scaled) < scaled.sub_(level)  # scaled is its fraction now
        # (adding the bools themselves would convert them on torch's slow mixed-type path)
        level.add_(up.to(level.dtype)).mul_(torch.sign(x)).add_(self.levels)  # [0, 2 levels]
        signed = torch.zeros(n, -(-m // 8) * 8, device=x.device,
                             dtype=torch.uint8 if self.width <= 8 else torch.int64)
        signed[:, :m] = level  # each row zero-padded to whole bytes, as pack_bits pads it
        planes = pack_bits(signed.reshape(-1), self.width).view(self.width, n, -1)
        return planes.permute(1, 0, 2).reshape(n, -1)  # each row's planes

    def encode_rows(self, chunks: torch.Tensor, states: list[dict[str, Any]]) -> Payload | None:
        """As OneBit.encode_rows: one draw of torch.rand for all rows, which on the CPU is the
        numbers one draw per row takes, in order. None (chunk by chunk) on a GPU, whose
        generator moves on by more for several calls than for one."""
        if chunks.device.type != "cpu":
            return None
        target = self.targets(chunks, states)
        rows = block_rows(target, self.bucket)
        norms = rows.norm(dim=1, keepdim=True).float()
        payload = {"norms": norms.view(len(target), -1),
                   "levels": self._level_rows(target, rows, norms)}
        if self.error_feedback:
            residuals = target - self.decode_rows(payload, target[0])
            for state, residual in zip(states, residuals):
                state["residual"] = residual
        return payload

    def decode_rows(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        """As OneBit.decode_rows."""
        n, m, size = payload["norms"].shape[0], like.numel(), self.bucket
        if self.width > 8:
            return torch.stack([self.decode({k: v[r] for k, v in payload.items()}, like)
                                for r in range(n)])
        padded = -(-m // 8) * 8
        planes = payload["levels"].view(n, self.width, -1).permute(1, 0, 2).reshape(-1)
        values = unpack_bytes(planes, n * padded, self.width).view(n, padded)
        scale = payload["norms"].to(like.dtype) / self.levels
        buckets = scale.shape[1]
        out = torch.zeros(n, buckets * size, dtype=like.dtype, device=like.device)
        out[:, :m] = values[:, :m]
        out[:, :m].sub_(self.levels)  # the signed level, exactly
        out.view(n, buckets, size).mul_(scale.unsqueeze(2))
        return out[:, :m]

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        n = like.numel()
        if self.width <= 8:
            values = unpack_bytes(payload["levels"], n, self.width)
        else:
            values = unpack_bits(payload["levels"], n, self.width)
        out = values.to(like.dtype).sub_(self.levels)  # the signed level, exactly
        scale = payload["norms"].to(like.dtype) / self.levels
        full = n // self.bucket
        out[:full * self.bucket].view(full, self.bucket).mul_(scale[:full].unsqueeze(1))
        if n > full * self.bucket:
            out[full * self.bucket:].mul_(scale[full])
        return out.view_as(like)


_FAST_QSGD: list[bool] = []


def _fast_qsgd_ok() -> bool:
    """Whether the compiled QSGD loop gives the torch code's payloads and leaves torch's
    generator where it would (checked once, the generator restored after)."""
    if not _FAST_QSGD:  # (under kernels.DRAWS, on the main thread: see QSGD.compress)
        saved, codec, ok = torch.get_rng_state(), QSGD(), True
        x = torch.randn(5000, generator=torch.Generator().manual_seed(9))
        for draws in (0, 1, 623, 1000):
            results = []
            for fast in (True, False):
                torch.default_generator.manual_seed(11)  # the CPU's alone: CUDA's untouched
                torch.rand(draws)
                rows, norms = codec._norms(x)
                payload = codec._compress_loop(x, norms) if fast \
                    else codec._compress_torch(x, rows, norms)
                results.append((payload["levels"], torch.rand(3)))
            ok = ok and all(torch.equal(a, b) for a, b in zip(*results))
        torch.set_rng_state(saved)
        _FAST_QSGD.append(ok)
    return _FAST_QSGD[0]
