"""Sparsifying codecs: a few elements are sent, as (indices, values); payloads of different
workers cannot be summed on the wire, so collectives gather them (collectives.py).

- `topk`: the `ratio` (2%) largest magnitudes, error feedback (Stich et al. 2018; Aji &
  Heafield 2017).
- `randomk`: `ratio` (2%) of the elements at random, error feedback; the indices are not
  sent, only the seed they are drawn from (8 bytes).
- `dgc`: Deep Gradient Compression (Lin et al. 2018): local gradient clipping, momentum
  correction (the velocity, not the gradient, is accumulated and sparsified), momentum-factor
  masking (sent coordinates restart their velocity), and sparsity warm-up (the density falls
  exponentially from 25% to `ratio` over `warmup_steps`). By default (`momentum = 0`) the
  momentum is the optimizer's: allreduce's momentum correction accumulates and sends the
  optimizer's update, which is DGC's velocity times -lr (strategies/correction.py), so the
  user's settings carry over; `momentum > 0` has the codec carry it, as in the paper, for an
  optimizer without momentum.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fastsgd.compress import kernels
from fastsgd.compress.base import Codec, Payload
from fastsgd.compress.shuffle import randperm_head
from fastsgd.config.options import Option, at_least, between


def unit_ratio(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def kept(numel: int, ratio: float) -> int:
    """How many of numel elements a sparse payload carries: at least one, if there is one."""
    return min(numel, max(1, math.ceil(ratio * numel)))


class TopK(Codec):
    name = "topk"
    kind = "sparse"
    FIELDS = ["indices", "values"]
    # 2% (1% before issue 11): with momentum SGD at the synchronous settings (lr 0.05,
    # momentum 0.9, updates compressed with error feedback, correction.py) 1% ended 1.03
    # points below no compression on the MLP benchmark, 2% 0.74 (docs/compression.md);
    # the k kept per step bounds how long error feedback holds a coordinate back (Stich et
    # al. 2018, "Sparsified SGD with memory": k/d sets the delay of the memory).
    OPTIONS = {"ratio": Option(float, 0.02, unit_ratio, "fraction of elements sent"),
               "error_feedback": Option(bool, True, doc="carry what was not sent to the next")}

    def __init__(self, ratio: float = 0.02, error_feedback: bool = True):
        self.ratio, self.error_feedback = ratio, error_feedback

    def compress(self, tensor: torch.Tensor) -> Payload:
        return top_k(tensor.reshape(-1), kept(tensor.numel(), self.ratio))

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        """`Codec.encode`: the residual becomes the target in place, the sent coordinates
        taken away (the same numbers as target - decode(payload))."""
        flat = tensor.detach().reshape(-1)
        if not self.error_feedback:
            return self.compress(flat)
        return top_k_of_sum(flat, state["residual"], kept(flat.numel(), self.ratio), take=True)

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return scatter(payload["indices"], payload["values"], like)


class RandomK(Codec):
    name = "randomk"
    kind = "sparse"
    FIELDS = ["seed", "values"]
    OPTIONS = {"ratio": Option(float, 0.02, unit_ratio, "fraction of elements sent"),
               "error_feedback": Option(bool, True, doc="carry what was not sent to the next")}

    def __init__(self, ratio: float = 0.02, error_feedback: bool = True):
        self.ratio, self.error_feedback = ratio, error_feedback

    def compress(self, tensor: torch.Tensor) -> Payload:
        x = tensor.reshape(-1)
        seed, indices = self._draw(x)
        return {"seed": seed, "values": x[indices]}

    def encode(self, tensor: torch.Tensor, state: dict[str, Any]) -> Payload:
        """`Codec.encode`: the residual is the target with the sent coordinates taken away
        (the same numbers as target - decode(payload)); the indices are drawn once."""
        flat = tensor.detach().reshape(-1)
        if not self.error_feedback:
            return self.compress(flat)
        target = state["residual"] = flat + state["residual"]
        seed, indices = self._draw(target)
        return {"seed": seed, "values": kernels.take(target, indices)}

    def _draw(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A seed (on x's device) and the indices it stands for."""
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)
        return seed.to(x.device), self._indices(int(seed), x)

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        indices = self._indices(int(payload["seed"]), like)
        return scatter(indices, payload["values"], like)

    def _indices(self, seed: int, like: torch.Tensor) -> torch.Tensor:
        """The same on every device: drawn on the CPU from the seed alone, the first k of
        `torch.randperm(numel, generator=torch.Generator().manual_seed(seed))`."""
        numel = like.numel()
        generator = torch.Generator().manual_seed(seed)
        chosen = randperm_head(numel, kept(numel, self.ratio), generator)
        return chosen.to(like.device)


class DGC(Codec):
    name = "dgc"
    kind = "sparse"
    FIELDS = ["indices", "values"]
    OPTIONS = {"ratio": Option(float, 0.001, unit_ratio, "final fraction of elements sent"),
               "momentum": Option(float, 0.0, between(0, 0.999), "the codec's own momentum "
                                  "(0: the optimizer's, which allreduce's momentum correction "
                                  "compresses)"),
               "clip": Option(float, 0.0, at_least(0), "local gradient norm clip (0: off)"),
               "warmup_steps": Option(int, 0, at_least(0), "steps of sparsity warm-up", steps=True)}
    START_DENSITY = 0.25  # Lin et al.: 75% sparsity in the first warm-up epoch

    def __init__(self, ratio: float = 0.001, momentum: float = 0.0, clip: float = 0.0,
                 warmup_steps: int = 0):
        self.ratio, self.momentum, self.clip, self.warmup = ratio, momentum, clip, warmup_steps

    def init(self, like: torch.Tensor) -> dict[str, Any]:
        zeros = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
        return {"velocity": zeros, "accumulated": zeros.clone(),
                "step": torch.zeros((), dtype=torch.int64)}

    def held_back(self, state: dict[str, Any]) -> torch.Tensor:
        return state["accumulated"]

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
        payload = top_k_of_sum(velocity, accumulated,
                               kept(grad.numel(), self.density(int(state["step"]))))
        accumulated[payload["indices"]] = 0  # sent: nothing of it is left to send
        velocity[payload["indices"]] = 0  # momentum-factor masking
        state["step"] += 1
        return payload

    def compress(self, tensor: torch.Tensor) -> Payload:
        return top_k(tensor.reshape(-1), kept(tensor.numel(), self.ratio))

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        return scatter(payload["indices"], payload["values"], like)


def top_k(x: torch.Tensor, k: int) -> Payload:
    """The k largest magnitudes of x: on the CPU in the order of their indices, elsewhere as
    torch.topk(sorted=False) orders them (decoding scatters them: the order changes nothing
    but the speed)."""
    magnitudes = x.abs()
    indices = _top_k_fast(magnitudes, k) if _fast_top_k_ok(x.device) else None
    if indices is None:
        indices = magnitudes.topk(k, sorted=False).indices
    return {"indices": indices.to(torch.int32), "values": x[indices]}


def _top_k_fast(magnitudes: torch.Tensor, k: int) -> torch.Tensor | None:
    """The indices of the k largest magnitudes, in increasing order, without a selection
    over all n elements, or None (then torch.topk is used).

    A threshold that a strided sample puts at about the 2k-th largest magnitude leaves a few
    thousand candidates, found with one comparison; the k-th largest of them (a quickselect,
    kthvalue) keeps the k largest. They are torch.topk's elements unless the k-th and the
    (k+1)-th largest are equal (then the choice is torch's), there is a NaN (which torch
    counts as largest), or the sample misjudged: then None. Up to k = n / 16 (topk's default
    is 2%)."""
    n = magnitudes.numel()
    if not _shortcut_fits(magnitudes, k):
        return None
    threshold = _threshold(magnitudes[::_stride(k)], k, n)
    if bool(torch.isnan(threshold)):
        return None
    candidates = (magnitudes >= threshold).nonzero().view(-1)
    if candidates.numel() > n // 4 or bool(torch.isnan(magnitudes.sum())):
        return None
    return _k_largest(candidates, magnitudes[candidates], k)


def _shortcut_fits(x: torch.Tensor, k: int) -> bool:
    return x.device.type == "cpu" and k * 16 <= x.numel() and x.numel() >= 4096


def _stride(k: int) -> int:
    return max(1, k // 32)  # about 64 of the sample's elements are above the threshold


def _threshold(sample: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """A magnitude near the 2k-th largest of n, from the magnitudes of a strided sample."""
    above = max(1, min(sample.numel(), -(-2 * k * sample.numel() // n)))
    return sample.topk(above, sorted=False).values.min()


def _k_largest(candidates: torch.Tensor, picked: torch.Tensor, k: int) -> torch.Tensor | None:
    """The candidates whose magnitudes (`picked`) are the k largest, or None (too few, or a
    tie at the k-th)."""
    count = candidates.numel()
    if count < k:
        return None
    kth = picked.kthvalue(count - k + 1).values  # the k-th largest
    keep = picked >= kth
    return candidates[keep] if int(keep.sum()) == k else None


def top_k_of_sum(addend: torch.Tensor, target: torch.Tensor, k: int,
                 take: bool = False) -> Payload:
    """target += addend, in place, then `top_k(target, k)`, and with `take` the payload's
    values are subtracted from target at their indices (error feedback's residual). On the
    CPU the sum, the scan for candidates and the NaN check are one pass
    (kernels.add_and_scan), and the selection, the payload and the subtraction another."""
    n = target.numel()
    if kernels.usable(addend, target) and _shortcut_fits(target, k) \
            and _fast_top_k_ok(target.device):
        stride = _stride(k)
        threshold = float(_threshold((target[::stride] + addend[::stride]).abs(), k, n))
        if threshold == threshold:  # not NaN
            candidates, nan = kernels.add_and_scan(addend, target, threshold, n // 4)
            payload = None if candidates is None or nan else \
                kernels.k_largest(target, candidates, k, take)
            return payload or _taken(top_k(target, k), target, take)  # torch's selection
    return _taken(top_k(target.add_(addend), k), target, take)


def _taken(payload: Payload, target: torch.Tensor, take: bool) -> Payload:
    if take:
        indices = payload["indices"].long()
        target[indices] = target[indices] - payload["values"].to(target.dtype)
    return payload


_FAST_TOP_K: dict[str, bool] = {}


def _fast_top_k_ok(device: torch.device) -> bool:
    """Whether _top_k_fast picks torch.topk's elements on this torch (checked once)."""
    if device.type != "cpu":
        return False
    if "cpu" not in _FAST_TOP_K:
        generator = torch.Generator().manual_seed(7)
        ok = True
        for n, k in [(65536, 1024), (100_000, 2000), (300_000, 300)]:
            m = torch.randperm(n, generator=generator).float()  # no ties
            fast = _top_k_fast(m, k)
            ok = ok and fast is not None and torch.equal(
                fast, m.topk(k, sorted=False).indices.sort().values)
        _FAST_TOP_K["cpu"] = ok
    return _FAST_TOP_K["cpu"]


def scatter(indices: torch.Tensor, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
    out[indices.long()] = values.to(like.dtype)
    return out.view_as(like)
