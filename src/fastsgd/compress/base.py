"""The Compressor protocol: a codec between a tensor and the payload that crosses the wire.

A codec is stateless; what it remembers between messages (error-feedback residuals,
momentum, step counters) is a `state` dict of tensors that the strategy keeps with its own
state, so it checkpoints as tensors. A codec's `kind` says how its payloads meet in a
collective (see collectives.py):

- `exact`: decode(encode(x)) == x, payloads are summed in flight (plain all-reduce);
- `quantize`: fixed-size payloads, compressed reduce-scatter then compressed all-gather;
- `sparse`: indices and values, which cannot be summed: gathered, then decoded and added;
- `lowrank`: PowerSGD, which all-reduces its own factors (`all_reduce`).

A quantizing codec may also offer `encode_rows(chunks, states)` and `decode_rows(payload,
like)`: the chunks of a compressed reduce-scatter (the rows of a matrix, each with its own
state) encoded at once, and many payloads of one size decoded at once, their fields stacked
as rows; each row must be, bit for bit, what `encode` or `decode` gives it alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch

from fastsgd.config.options import Configurable, Option

Payload = dict[str, torch.Tensor]
KINDS = ("exact", "quantize", "sparse", "lowrank")  # how payloads meet (above; collectives.py)


class Compressor(Protocol):
    name: str
    kind: str
    FIELDS: list[str]  # the payload's tensors, in wire order

    def init(self, like: torch.Tensor) -> dict[str, Any]:
        """The state of a message stream of tensors shaped like `like`."""
        ...

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        """The payload to send for `tensor`, with error feedback (updates `state`)."""
        ...

    def compress(self, tensor: torch.Tensor) -> Payload:
        """The payload for `tensor` alone: no memory of earlier messages."""
        ...

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor: ...

    def nbytes(self, payload: Payload) -> int: ...


def payload_bytes(payload: Payload) -> int:
    return sum(t.numel() * t.element_size() for t in payload.values())


class Codec(Configurable, ABC, section="compression"):
    """The base class of a codec (`fastsgd.Codec`): subclass it and write `compress` and
    `decode`; `compression.name = "module:Class"` runs it.

    What a subclass declares (checked when a job starts, compress/contract.py):

    - `name` (required, a str): what summaries and reports call the codec.
    - `kind` (default "quantize"): how its payloads meet in a collective, one of `KINDS`
      (see this module's docstring). A strategy refuses a codec of a kind it does not
      carry (its `capabilities.codec_kinds`).
    - `FIELDS` (default []): the payload's tensors, in wire order.
    - `OPTIONS` (default {}): one `fastsgd.Option` per constructor argument; they become
      the `compression.*` keys, and config.toml records the values it was built with.
    - `error_feedback` (default False): `encode` adds to each message what the earlier
      ones left out (Seide et al. 2014; Karimireddy et al. 2019): what is sent plus the new
      residual equals what was to be sent plus the old residual.

    Methods: `compress(tensor) -> payload` and `decode(payload, like) -> tensor` (abstract);
    `init(like)`, `encode(tensor, state)` and `nbytes(payload)` have defaults (below).
    """

    name = "codec"
    kind = "quantize"
    FIELDS: list[str] = []
    OPTIONS: dict[str, Option] = {}
    error_feedback = False

    def init(self, like: torch.Tensor) -> dict[str, Any]:
        """The state of a message stream shaped like `like`: a residual under error feedback,
        else nothing."""
        if not self.error_feedback:
            return {}
        return {"residual": torch.zeros(like.numel(), dtype=like.dtype, device=like.device)}

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        """`compress(tensor)`, plus the residual in `state` under error feedback."""
        flat = tensor.detach().reshape(-1)
        if not self.error_feedback:
            return self.compress(flat)
        target = flat + state["residual"]
        payload = self.compress(target)
        state["residual"] = target - self.decode(payload, target)
        return payload

    def targets(self, chunks: torch.Tensor, states: list[dict[str, Any]]) -> torch.Tensor:
        """The rows of chunks as `encode_rows` encodes them: under error feedback each plus
        its state's residual (a new tensor), as `encode` adds them."""
        if not self.error_feedback:
            return chunks.detach()
        return chunks.detach() + torch.stack([s["residual"] for s in states])

    def held_back(self, state: dict[str, Any]) -> torch.Tensor | None:
        """What earlier encodes have not sent yet (flat); None: this codec keeps nothing."""
        return state.get("residual")

    @abstractmethod
    def compress(self, tensor: torch.Tensor) -> Payload:
        """The payload for a flat `tensor` alone: a dict of tensors keyed by `FIELDS`."""

    @abstractmethod
    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        """The tensor a payload stands for, shaped and typed like `like`."""

    def nbytes(self, payload: Payload) -> int:
        """The bytes a payload takes on the wire (what runs count and the simulator prices)."""
        return payload_bytes(payload)


class Identity(Codec):
    """No compression: the payload is the tensor itself."""

    name = "none"
    kind = "exact"
    FIELDS = ["values"]

    def compress(self, tensor: torch.Tensor) -> Payload:
        return {"values": tensor.reshape(-1)}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return payload["values"].view_as(like)
