"""Typed tensor frames: how an asynchronous message crosses the wire.

A frame is a fixed header (int64 x 8: magic, version, tag, element count, dtype code, the
sender's step) then the payload tensor. Nothing received from a peer is unpickled; a header
that does not parse is an error that names the peer.
"""

from __future__ import annotations

import torch

from fastsgd.errors import UserError

MAGIC = 0x46415354  # "FAST"
VERSION = 1
HEADER_WORDS = 8
HEADER_BYTES = HEADER_WORDS * 8
# Tags: the strategies' messages from 0 up; fastsgd's own below 0: -1 a transport's stop
# (and goodbye), -2 hello, -3 exchange, -4 a joiner's state, -1000 and below the collectives
# among survivors (survivors.py).
STOP_TAG = -1  # a frame a transport sends itself to stop its receiver
EXCHANGE_TAG = -3  # the rounds of `exchange` (exchange.py)
JOIN_TAG = -4  # the donor's state for a worker that joins (rejoin.py)

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.uint8, torch.int8, torch.bool)


class MalformedFrame(UserError):
    """A peer sent bytes that are not a fastsgd frame (another program, a version skew)."""


def header(tensor: torch.Tensor, tag: int, step: int = 0) -> torch.Tensor:
    if tensor.dtype not in DTYPES:
        raise TypeError(f"cannot send a tensor of dtype {tensor.dtype}")
    words = [MAGIC, VERSION, tag, tensor.numel(), DTYPES.index(tensor.dtype), step]
    return torch.tensor(words + [0] * (HEADER_WORDS - len(words)), dtype=torch.int64)


def parse(words: torch.Tensor, peer: int) -> tuple[int, int, torch.dtype]:
    """(tag, element count, dtype) of a received header, or MalformedFrame naming `peer`."""
    magic, version, tag, numel, code = (int(w) for w in words[:5])
    if magic != MAGIC:
        raise MalformedFrame(f"malformed frame from worker {peer}: bad magic {magic:#x}")
    if version != VERSION:
        raise MalformedFrame(f"frame from worker {peer} has version {version}, "
                             f"this fastsgd speaks {VERSION}: mixed fastsgd versions?")
    if not 0 <= code < len(DTYPES) or numel < 0:
        raise MalformedFrame(f"malformed frame from worker {peer}: dtype code {code}, "
                             f"{numel} elements")
    return tag, numel, DTYPES[code]


def shows_progress(tag: int) -> bool:
    """Does a frame with `tag` say that its sender got as far as the step it is stamped
    with? A step's own traffic does (the strategies' messages, the exchange's); the frames
    between steps do not (hello, a joiner's state, the collectives of start-up, evaluation
    and the end): a worker killed in step 0 after the start-up collectives, before its
    exchange, left at step 0, and its peers waited for its exchange of step 0 for good."""
    return tag >= 0 or tag == EXCHANGE_TAG


def step_of(words: torch.Tensor) -> int:
    """The step the sender was at when it sent the frame (0 where it does not say)."""
    return int(words[5])


def frame_bytes(tensor: torch.Tensor) -> int:
    return HEADER_BYTES + tensor.numel() * tensor.element_size()


def as_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    return memoryview(tensor.view(torch.uint8).numpy()) if tensor.numel() else memoryview(b"")
