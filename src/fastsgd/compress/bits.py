"""Bit packing: small unsigned integers stored `width` bits each, 8 bits to a byte.

A value of `width` bits is split into `width` bit planes, each packed 8 to a byte, so any
width costs exactly ceil(n / 8) bytes per plane and needs no cross-byte arithmetic. In a
byte, the first of its 8 values is the most significant bit.

The packing works on int64 words of 8 one-byte values at a time: multiplying a word whose
bytes are 0 or 1 by 0x8040201008040201 gathers its 8 bits, first byte highest, into the
word's top byte (every partial product lands on its own bit, so nothing carries), and the
same multiply spreads a byte's 8 bits back out, one to a byte. That needs a little-endian
machine (every one torch runs on); elsewhere the plain per-bit form below is used.

Also: a bucket's value chosen per flag on the floats' bit patterns (`by_bucket`), and a
flat tensor as rows of buckets (`blocks`).
"""

from __future__ import annotations

import sys

import torch

_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)
_GATHER = 0x8040201008040201 - 2**64  # the magic multiplier, as a signed int64
_ONES = 0x0101010101010101  # the low bit of every byte of a word
_FAST = sys.byteorder == "little"


def _bytes_of(values: torch.Tensor, n: int, shift: int) -> torch.Tensor:
    """Bits shift..shift+7 of the first n values, one uint8 each, zero-padded to a multiple
    of 8 and 8-aligned, so the result views as int64 words."""
    padded = -(-n // 8) * 8
    if values.dtype in (torch.bool, torch.uint8) and shift == 0:
        flat = values.reshape(-1)
        if (padded == n and flat.is_contiguous() and flat.storage_offset() % 8 == 0):
            return flat.view(torch.uint8)
        out = torch.zeros(padded, dtype=torch.uint8, device=values.device)
        out[:n] = flat[:n]
        return out
    v = values.reshape(-1)[:n]
    if shift:
        v = v >> shift
    out = torch.zeros(padded, dtype=torch.uint8, device=values.device)
    out[:n] = v  # the low 8 bits (casting to uint8 wraps)
    return out


def pack_bits(values: torch.Tensor, width: int = 1) -> torch.Tensor:
    """Pack the low `width` bits of each integer (or bool) of `values` (1-D) into uint8
    bytes: `width` planes of ceil(n / 8) bytes each."""
    n = values.numel()
    if not _FAST:
        return _pack_bits_plain(values, width)
    nbytes = -(-n // 8)
    out = torch.empty(width, nbytes, dtype=torch.uint8, device=values.device)
    word = torch.empty(nbytes, dtype=torch.int64, device=values.device)
    for group in range(0, width, 8):  # planes group..group+7 come from one byte per value
        words = _bytes_of(values, n, group).view(torch.int64)
        for plane in range(group, min(width, group + 8)):
            if plane == group and values.dtype == torch.bool:
                torch.mul(words, _GATHER, out=word)  # bytes are 0 or 1 already
            else:
                torch.bitwise_right_shift(words, plane - group, out=word)
                word.bitwise_and_(_ONES).mul_(_GATHER)
            out[plane] = word.view(torch.uint8).view(nbytes, 8)[:, 7]  # the top byte
    return out.reshape(-1)


def unpack_flags(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The n bools that `pack_bits(flags)` packed into `packed`."""
    return _unpack_bytes(packed, 1)[0].view(torch.bool)[:n]


def unpack_bytes(packed: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """The n values (uint8) that `pack_bits(values, width)` packed, for width <= 8."""
    assert width <= 8
    return _unpack_bytes(packed, width)[0][:n]


def unpack_bits(packed: torch.Tensor, n: int, width: int = 1) -> torch.Tensor:
    """The `n` integers (int64) that `pack_bits(values, width)` packed into `packed`."""
    if not _FAST:
        return _unpack_bits_plain(packed, n, width)
    parts = _unpack_bytes(packed, width)
    out = parts[0][:n].to(torch.int64)
    for group, part in enumerate(parts[1:], 1):
        out |= part[:n].to(torch.int64) << (8 * group)
    return out


def _unpack_bytes(packed: torch.Tensor, width: int) -> list[torch.Tensor]:
    """Per 8 planes, a uint8 tensor of ceil(n / 8) * 8 values holding those planes' bits."""
    if not _FAST:
        n = packed.numel() // width * 8
        values = _unpack_bits_plain(packed, n, width)
        return [((values >> g) & 0xFF).to(torch.uint8) for g in range(0, width, 8)]
    planes = packed.view(width, -1)
    nbytes = planes.shape[1]
    spread = torch.empty(nbytes, dtype=torch.int64, device=packed.device)
    parts = []
    for group in range(0, width, 8):
        acc = torch.empty(nbytes, dtype=torch.int64, device=packed.device)
        for plane in range(group, min(width, group + 8)):
            bit = plane - group
            target = acc if plane == group else spread
            target.copy_(planes[plane])
            # bit b of the byte lands at the top of byte 7 - b: move it to bit `bit`
            target.mul_(_GATHER).bitwise_right_shift_(7 - bit).bitwise_and_(_signed(_ONES << bit))
            if target is not acc:
                acc |= spread
        parts.append(acc.view(torch.uint8))
    return parts


def _signed(word: int) -> int:
    return word - 2**64 if word >= 2**63 else word


def _pack_bits_plain(values: torch.Tensor, width: int) -> torch.Tensor:
    n = values.numel()
    padded = torch.zeros(width, (n + 7) // 8 * 8, dtype=torch.uint8, device=values.device)
    v = values.reshape(-1).to(torch.int64)
    for plane in range(width):
        padded[plane, :n] = ((v >> plane) & 1).to(torch.uint8)
    weights = _WEIGHTS.to(values.device)
    return (padded.view(width, -1, 8) * weights).sum(-1, dtype=torch.uint8).reshape(-1)


def _unpack_bits_plain(packed: torch.Tensor, n: int, width: int) -> torch.Tensor:
    weights = _WEIGHTS.to(packed.device)
    planes = (packed.view(width, -1, 1) & weights).ne(0).reshape(width, -1)[:, :n]
    shifts = torch.arange(width, device=packed.device).view(-1, 1)
    return (planes.to(torch.int64) << shifts).sum(0)


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def by_bucket(flags: torch.Tensor, high: torch.Tensor, low: torch.Tensor,
              size: int) -> torch.Tensor:
    """Per element i of flags (n bools), high[i // size] where set, else low[i // size].

    As torch.where, but on the floats' bit patterns: flag * (high ^ low) ^ low is high's
    bits or low's, and these integer ops run vectorized, where torch.where does not."""
    n, full = flags.numel(), flags.numel() // size
    itype = _INT[high.element_size()]
    low = low.reshape(-1).view(itype)
    diff = high.reshape(-1).view(itype) ^ low
    out = flags.reshape(-1).to(itype)  # 0 or 1
    main = out[:full * size].view(full, size)
    main.mul_(diff[:full].unsqueeze(1)).bitwise_xor_(low[:full].unsqueeze(1))
    if n > full * size:
        out[full * size:].mul_(diff[full]).bitwise_xor_(low[full])
    return out.view(high.dtype)


def by_bucket_rows(flags: torch.Tensor, high: torch.Tensor, low: torch.Tensor,
                   size: int) -> torch.Tensor:
    """`by_bucket` of each row of flags (n, m) with its own row of high and low (n,
    buckets): row r is by_bucket(flags[r], high[r], low[r], size), bit for bit, in a few
    calls for all rows (a compressed all-reduce decodes a chunk from each worker)."""
    n, m = flags.shape
    itype = _INT[high.element_size()]
    low = low.reshape(n, -1).view(itype)
    diff = high.reshape(n, -1).view(itype) ^ low
    out = torch.zeros(n, low.shape[1] * size, dtype=itype, device=flags.device)
    out[:, :m] = flags
    out.view(n, -1, size).mul_(diff.unsqueeze(2)).bitwise_xor_(low.unsqueeze(2))
    return out[:, :m].view(high.dtype)


def pack_flag_rows(flags: torch.Tensor) -> torch.Tensor:
    """Each row of flags (n, m) packed as pack_bits packs it alone: (n, ceil(m / 8)) bytes,
    each row's last byte zero-padded."""
    n, m = flags.shape
    padded = torch.zeros(n, -(-m // 8) * 8, dtype=torch.bool, device=flags.device)
    padded[:, :m] = flags
    return pack_bits(padded.reshape(-1)).view(n, -1)


def unpack_flag_rows(packed: torch.Tensor, m: int) -> torch.Tensor:
    """The flags of each row of `packed` (n, bytes), each row packed by pack_bits from m
    flags: (n, m) bools. Bytes unpack on their own, so all rows unpack as one."""
    n = packed.shape[0]
    return unpack_flags(packed.reshape(-1), packed.numel() * 8).view(n, -1)[:, :m]


def block_rows(x: torch.Tensor, size: int) -> torch.Tensor:
    """`blocks` of each row of x (n, m): (n * ceil(m / size), size), each row's last bucket
    padded with zeros."""
    n, m = x.shape
    buckets = -(-m // size)
    if m != buckets * size:
        x = torch.cat([x, x.new_zeros(n, buckets * size - m)], 1)
    return x.reshape(n * buckets, size)


def blocks(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """The elements of `tensor` as rows of `size` (the last one padded with zeros)."""
    x = tensor.reshape(-1)
    padded = x.new_zeros(-(-x.numel() // size) * size)
    padded[:x.numel()] = x
    return padded.view(-1, size)
