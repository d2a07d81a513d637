"""Sparsifying codecs: a few elements are sent, as (indices, values); payloads of different
workers cannot be summed on the wire, so collectives gather them (collectives.py).

- `topk`: the `ratio` largest magnitudes, error feedback (Stich et al. 2018; Aji & Heafield 2017).
- `randomk`: `ratio` of the elements at random, error feedback; the indices are not sent, only
  the seed they are drawn from (8 bytes).
- `dgc`: Deep Gradient Compression (Lin et al. 2018): local gradient clipping, momentum
  correction (the velocity, not the gradient, is accumulated and sparsified), momentum-factor
  masking (sent coordinates restart their velocity), and sparsity warm-up (the density falls
  exponentially from 25% to `ratio` over `warmup_steps`). The codec carries the momentum:
  use it with an optimizer without momentum.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fastsgd.compress.base import Codec, Payload
from fastsgd.options import Option, at_least, between


def unit_ratio(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def kept(numel: int, ratio: float) -> int:
    return max(1, min(numel, math.ceil(ratio * numel)))


class TopK(Codec):
    name = "topk"
    kind = "sparse"
    FIELDS = ["indices", "values"]
    OPTIONS = {"ratio": Option(float, 0.01, unit_ratio, "fraction of elements sent"),
               "error_feedback": Option(bool, True, doc="carry what was not sent to the next")}

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True):
        self.ratio, self.error_feedback = ratio, error_feedback

    def compress(self, tensor: torch.Tensor) -> Payload:
        return top_k(tensor.reshape(-1), kept(tensor.numel(), self.ratio))

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return scatter(payload["indices"], payload["values"], like)


class RandomK(Codec):
    name = "randomk"
    kind = "sparse"
    FIELDS = ["seed", "values"]
    OPTIONS = TopK.OPTIONS

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True):
        self.ratio, self.error_feedback = ratio, error_feedback

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = tensor.reshape(-1)
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)
        return {"seed": seed.to(x.device), "values": x[self._indices(int(seed), x)]}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        indices = self._indices(int(payload["seed"]), like)
        return scatter(indices, payload["values"], like)

    def _indices(self, seed: int, like: torch.Tensor) -> torch.Tensor:
        """The same on every device: drawn on the CPU from the seed alone."""
        numel = like.numel()
        generator = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(numel, generator=generator)[:kept(numel, self.ratio)]
        return chosen.to(like.device)


class DGC(Codec):
    name = "dgc"
    kind = "sparse"
    FIELDS = ["indices", "values"]
    OPTIONS = {"ratio": Option(float, 0.001, unit_ratio, "final fraction of elements sent"),
               "momentum": Option(float, 0.9, between(0, 0.999), "momentum correction"),
               "clip": Option(float, 0.0, at_least(0), "local gradient norm clip (0: off)"),
               "warmup_steps": Option(int, 0, at_least(0), "steps of sparsity warm-up")}
    START_DENSITY = 0.25  # Lin et al.: 75% sparsity in the first warm-up epoch

    def __init__(self, ratio: float = 0.001, momentum: float = 0.9, clip: float = 0.0,
                 warmup_steps: int = 0):
        self.ratio, self.momentum, self.clip, self.warmup = ratio, momentum, clip, warmup_steps

    def init(self, like: torch.Tensor) -> dict[str, Any]:
        zeros = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
        return {"velocity": zeros, "accumulated": zeros.clone(),
                "step": torch.zeros((), dtype=torch.int64)}

    def density(self, step: int) -> float:
        if step >= self.warmup or self.ratio >= self.START_DENSITY:
            return self.ratio
        return self.START_DENSITY * (self.ratio / self.START_DENSITY) ** (step / self.warmup)

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        grad = tensor.detach().reshape(-1)
        if self.clip > 0:
            grad = grad * min(1.0, self.clip / (float(grad.norm()) + 1e-12))
        velocity, accumulated = state["velocity"], state["accumulated"]
        velocity.mul_(self.momentum).add_(grad)
        accumulated.add_(velocity)
        payload = top_k(accumulated, kept(grad.numel(), self.density(int(state["step"]))))
        accumulated[payload["indices"]] = 0  # sent: nothing of it is left to send
        velocity[payload["indices"]] = 0  # momentum-factor masking
        state["step"] += 1
        return payload

    def compress(self, tensor: torch.Tensor) -> Payload:
        return top_k(tensor.reshape(-1), kept(tensor.numel(), self.ratio))

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return scatter(payload["indices"], payload["values"], like)


def top_k(x: torch.Tensor, k: int) -> Payload:
    indices = x.abs().topk(k, sorted=False).indices
    return {"indices": indices.to(torch.int32), "values": x[indices]}


def scatter(indices: torch.Tensor, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
    out[indices.long()] = values.to(like.dtype)
    return out.view_as(like)
