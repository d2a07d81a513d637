"""A codec that reports how much it encodes, so that the simulator charges its time where
and as much as a strategy uses it: every step for allreduce, once a round for localsgd
and diloco, a share of the model for sparta (issue 51, item 2). What the profile measures
(`compute.codec`) is one whole gradient encoded and decoded; each encode is charged its
share of that."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastsgd.compress.base import Compressor, Payload


class Metered:
    """`codec` as it is, but for encode, compress and encode_rows, which call
    `charge(elements)` first. Everything else (name, kind, FIELDS, init, decode...) is the
    codec's own."""

    def __init__(self, codec: Compressor, charge: Callable[[int], None]):
        self.__dict__.update(_codec=codec, _charge=charge)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_codec", "_charge"):
            raise AttributeError(name)
        return getattr(self._codec, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._codec, name, value)

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        self._charge(tensor.numel())
        return self._codec.encode(tensor, state)

    def compress(self, tensor: torch.Tensor) -> Payload:
        self._charge(tensor.numel())
        return self._codec.compress(tensor)

    def encode_rows(self, chunks: torch.Tensor, states: list[dict[str, Any]]) -> Payload | None:
        rows = getattr(self._codec, "encode_rows", None)
        payload = rows(chunks, states) if rows is not None else None
        if payload is not None:  # else the caller encodes chunk by chunk (charged there)
            self._charge(chunks.numel())
        return payload
