"""Payloads on the wire: the tensors of a payload as one self-describing uint8 buffer.

Layout: int64 words [count, (dtype code, numel) * count], then each tensor's raw bytes.
Payload tensors are 1-D; the codec's `decode` gives them their shape back. Nothing is
unpickled: a buffer that does not parse is an error naming its sender.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import torch

from fastsgd.compress.base import Payload
from fastsgd.errors import UserError

# A dtype's code is its place here: new ones go at the end, so old buffers keep parsing. Every
# float, integer, bool and complex dtype torch has (the float8s and the wide unsigned ints
# where this torch has them); not the quantized ones (a scale rides beside their values).
_NAMES = ("float32", "float16", "bfloat16", "uint8", "int32", "int64", "float64", "int8",
          "int16", "uint16", "uint32", "uint64", "bool", "complex32", "complex64", "complex128",
          "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
DTYPES = [getattr(torch, name, None) for name in _NAMES]  # None: absent from this torch
_WORD = 8


def pack(payload: Mapping[str, torch.Tensor | Sequence[torch.Tensor]]) -> torch.Tensor:
    """One uint8 buffer holding every tensor of `payload`, in its order. A field may be a
    list of tensors of one dtype, packed as their concatenation: a model's parameters go
    straight into the buffer, with no flat copy of them first."""
    fields = [[t] if isinstance(t, torch.Tensor) else list(t) for t in payload.values()]
    parts = [[t.detach().reshape(-1).contiguous() for t in field] for field in fields]
    device = parts[0][0].device if parts else torch.device("cpu")
    words = [len(parts)]
    for field in parts:
        if len({t.dtype for t in field}) != 1:
            raise ValueError(f"a packed field mixes dtypes: {[t.dtype for t in field]}")
        words += [_code(field[0].dtype), sum(t.numel() for t in field)]
    header = torch.tensor(words, dtype=torch.int64, device=device).view(torch.uint8)
    return torch.cat([header, *(t.to(device).view(torch.uint8) for f in parts for t in f)])


def pack_rows(payload: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """n payloads whose fields are stacked as rows (n, numel): (n, bytes), row r what `pack`
    gives payload r (their headers are alike)."""
    fields = [t.contiguous() for t in payload.values()]
    words = [len(fields)]
    for field in fields:
        words += [_code(field.dtype), field.shape[1]]
    header = torch.tensor(words, dtype=torch.int64, device=fields[0].device).view(torch.uint8)
    return torch.cat([header.expand(fields[0].shape[0], -1),
                      *(field.view(torch.uint8) for field in fields)], 1)


def unpack(buffer: torch.Tensor, keys: list[str], sender: int | str = "?",
           copy: bool = True) -> Payload:
    """The payload `pack` made, its tensors named by `keys` (the codec's field order), on the
    buffer's device. `copy=False`: each field whose offset suits its dtype is a view of
    `buffer` (no copy), for a receiver that only reads it and leaves the buffer alone; the
    simulator hands the sender's own buffer over."""
    try:
        (count,) = _words(buffer, 0, 1)  # the header read as bytes: two small copies, where
        if count != len(keys):  # int64 views of it took eight torch calls (twice a gossip step)
            raise ValueError(f"{count} fields, expected {len(keys)}")
        words = _words(buffer, _WORD, 2 * count)
        out, offset = {}, _WORD * (1 + 2 * count)
        for key, code, numel in zip(keys, words[::2], words[1::2]):
            dtype = DTYPES[code] if 0 <= code < len(DTYPES) else None
            if dtype is None:
                raise ValueError(f"dtype code {code} is not one this torch carries")
            item = dtype.itemsize
            field = buffer[offset:offset + numel * item]
            aligned = (buffer.storage_offset() + offset) % item == 0  # else a view is refused
            out[key] = (field if aligned and not copy else field.clone()).view(dtype)
            offset += numel * item
        if offset != buffer.numel():
            raise ValueError(f"{buffer.numel() - offset} bytes left over")
        return out
    except (ValueError, IndexError, RuntimeError) as e:
        raise UserError(f"malformed compressed payload from worker {sender}: {e}") from None


def unpack_rows(buffers: Sequence[torch.Tensor], keys: list[str],
                sender: int | str = "?") -> Payload | None:
    """The payloads of `buffers` with each field stacked as rows (n, numel), for a codec
    that decodes them at once; None unless all have one layout (the same header, so the
    same length), where each must be unpacked alone (and a malformed one named by its
    sender). `sender`: the first buffer's, whose header is checked."""
    first = buffers[0]
    if any(b.numel() != first.numel() for b in buffers):
        return None
    fields = unpack(first, keys, sender, copy=False)  # a malformed layout raises here
    stacked = torch.stack(list(buffers))
    offset = _WORD * (1 + 2 * len(keys))
    if not bool((stacked[:, :offset] == stacked[0, :offset]).all()):
        return None
    out = {}
    for key, field in fields.items():
        size = field.numel() * field.element_size()
        out[key] = stacked[:, offset:offset + size].contiguous().view(field.dtype)
        offset += size
    return out


def _code(dtype: torch.dtype) -> int:
    """`dtype`'s code on the wire; a UserError naming it where none is carried."""
    if dtype not in DTYPES:
        carried = ", ".join(str(d).removeprefix("torch.") for d in DTYPES if d is not None)
        raise UserError(f"a codec's payload holds a {str(dtype).removeprefix('torch.')} "
                        f"tensor, which cannot cross the wire: payload dtypes are {carried}")
    return DTYPES.index(dtype)


def _words(buffer: torch.Tensor, start: int, count: int) -> tuple[int, ...]:
    """`count` int64 words of `buffer` from byte `start` (native order, as `pack` wrote them)."""
    raw = bytes(buffer[start:start + _WORD * count].tolist())
    if len(raw) != _WORD * count:
        raise ValueError(f"{buffer.numel()} bytes: too short for its header")
    return struct.unpack(f"={count}q", raw)
