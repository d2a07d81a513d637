"""The Compressor protocol: a codec between a tensor and the payload that crosses the wire.

State is explicit (error-feedback residuals, counters) so that it checkpoints as tensors.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from fastsgd.options import Option

Payload = dict[str, torch.Tensor]


class Compressor(Protocol):
    name: str

    def init(self, like: torch.Tensor) -> dict[str, Any]:
        """The codec state for messages shaped like `like`."""
        ...

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        """The payload to send for `tensor` (may update `state`, e.g. the residual)."""
        ...

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor: ...

    def nbytes(self, payload: Payload) -> int: ...


class Identity:
    """No compression: the payload is the tensor itself."""

    name = "none"
    OPTIONS: dict[str, Option] = {}
    exact = True  # decode(encode(x)) == x, so payloads can be summed in flight

    def init(self, like: torch.Tensor) -> dict[str, Any]:
        return {}

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        return {"values": tensor}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return payload["values"].view_as(like)

    def nbytes(self, payload: Payload) -> int:
        return sum(t.numel() * t.element_size() for t in payload.values())
