"""Payloads on the wire: the tensors of a payload as one self-describing uint8 buffer.

Layout: int64 words [count, (dtype code, numel) * count], then each tensor's raw bytes.
Payload tensors are 1-D; the codec's `decode` gives them their shape back. Nothing is
unpickled: a buffer that does not parse is an error naming its sender.
"""

from __future__ import annotations

import torch

from fastsgd.compress.base import Payload
from fastsgd.errors import UserError

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.int32, torch.int64,
          torch.float64]
_WORD = 8


def pack(payload: Payload) -> torch.Tensor:
    """One uint8 buffer holding every tensor of `payload`, in its order."""
    parts = [t.detach().reshape(-1).contiguous() for t in payload.values()]
    device = parts[0].device if parts else torch.device("cpu")
    words = [len(parts)]
    for t in parts:
        words += [DTYPES.index(t.dtype), t.numel()]
    header = torch.tensor(words, dtype=torch.int64, device=device).view(torch.uint8)
    return torch.cat([header, *(t.to(device).view(torch.uint8) for t in parts)])


def unpack(buffer: torch.Tensor, keys: list[str], sender: int | str = "?") -> Payload:
    """The payload `pack` made, its tensors named by `keys` (the codec's field order), on the
    buffer's device."""
    try:
        count = int(buffer[:_WORD].clone().view(torch.int64))
        words = buffer[_WORD:_WORD * (1 + 2 * count)].clone().view(torch.int64).tolist()
        if count != len(keys) or len(words) != 2 * count:
            raise ValueError(f"{count} fields, expected {len(keys)}")
        out, offset = {}, _WORD * (1 + 2 * count)
        for key, code, numel in zip(keys, words[::2], words[1::2]):
            dtype = DTYPES[code]
            size = numel * torch.empty(0, dtype=dtype).element_size()
            out[key] = buffer[offset:offset + size].clone().view(dtype)  # clone: aligned
            offset += size
        if offset != buffer.numel():
            raise ValueError(f"{buffer.numel() - offset} bytes left over")
        return out
    except (ValueError, IndexError, RuntimeError) as e:
        raise UserError(f"malformed compressed payload from worker {sender}: {e}") from None
