"""Staleness-aware optimizer settings: what an asynchronous strategy does to the user's
optimizer so that it trains at the synchronous settings (docs/strategies.md, "What each
strategy does to your optimizer").

The user tunes lr and momentum for synchronous SGD on the global batch. An asynchronous
strategy changes what those numbers mean in two ways:

- The rate. Where every worker's optimizer step lands on one shared model (a parameter
  server's shard, Hogwild's shared vector), the model moves by the *sum* of the workers'
  steps, where synchronous SGD moves by their *mean*: n times the rate (Dean et al. 2012
  use a smaller rate for Downpour for this reason). Where each worker trains a model of its
  own on its own batch (a tournament), each model sees batch B, not n B: a rate tuned for
  n B is too large. We scale it by 1/n, the linear scaling rule (Krizhevsky 2014, "One
  weird trick for parallelizing convolutional neural networks"; Goyal et al. 2017,
  "Accurate, Large Minibatch SGD"); the square-root rule's 1/sqrt(n) (Hoffer et al. 2017)
  did worse over two seeds on the benchmark (ltfb, 1500 steps: 85.97% and 85.86% at lr/4,
  86.17% and 84.84% at lr/2), though it trains faster in short runs.
- The momentum. Updates computed on parameters that are τ updates old behave like an extra,
  implicit momentum (Mitliagkas et al. 2016, "Asynchrony begets momentum, with an
  application to deep learning"): with a geometric staleness of mean τ, asynchronous SGD is
  in expectation momentum SGD with momentum τ / (1 + τ) (1 − 1/M for M workers in a queue,
  mean staleness M − 1). Their prescription is to lower the explicit momentum as the implicit
  one grows, so that the total stays where the user tuned it.

How the two momenta combine. Momentum μ amplifies a steady gradient 1/(1 − μ) times and
spreads it over about 1/(1 − μ) steps; two momentum filters in series (explicit μ_e, implicit
μ_i) spread it over (1/(1 − μ_e))(1/(1 − μ_i)), so the explicit momentum that keeps the
user's total time constant 1/(1 − μ) is 1 − (1 − μ)(1 − μ_i) = 1 − (1 − μ)(1 + τ), never
below 0 (`explicit_momentum`). Mitliagkas et al. go below zero under high asynchrony; we
stop at plain SGD. Which staleness each strategy has: `ps`, M = n workers updating the
servers' model in turn, the paper's queueing model (τ = n − 1; on the benchmark, the
server averaging the pushes, momentum 0.9 gave 80.1%, 0.825 85.2%, 0.6 86.0%, 0.3 85.3%);
`ssp`, the mean age of the gradient it applies, s (n − 1)/n steps; `hogwild`, none counted:
its workers read and write one vector in memory, a gradient misses at most the steps the
others take while it is computed, as a synchronous step misses the others' gradients of
that step (lr/n at momentum 0.9: 87.35%, at 0.6: 86.57%, allreduce 87.00%).

`Adjustment.apply` rewrites the optimizer's param groups once (at `init`), from the values
the user set, which it keeps in each group (`ORIGINAL`), so applying it again (a new
Replica on the same optimizer, a restored checkpoint) does not compound. Nothing here reads
a clock: the settings follow from the strategy's options and the number of workers, so the
simulator stays deterministic and real processes get the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fastsgd.config.options import Option

ORIGINAL = "fastsgd_original"  # key in a param group: the user's lr and momentum

ADAPT_OPTION = Option(bool, True, doc="adapt the optimizer's lr/momentum to the strategy's "
                      "asynchrony (docs/strategies.md; false: the optimizer as configured)")


def implicit_momentum(staleness: float) -> float:
    """Momentum that a mean staleness of `staleness` updates brings (Mitliagkas et al. 2016):
    τ / (1 + τ); 1 − 1/M for M workers in a queue (τ = M − 1)."""
    return staleness / (1.0 + staleness) if staleness > 0 else 0.0


def queue_staleness(workers: int) -> float:
    """Mean staleness, in updates, of `workers` workers updating one model asynchronously
    (Mitliagkas et al. 2016's queueing model: each update is n - 1 updates old)."""
    return float(max(0, workers - 1))


def explicit_momentum(momentum: float, staleness: float) -> float:
    """The explicit momentum that keeps the total (explicit and implicit in series) at
    `momentum`: 1 − (1 − μ)(1 + τ), at least 0; `momentum` itself without staleness."""
    if momentum <= 0 or staleness <= 0:
        return momentum
    return max(0.0, 1.0 - (1.0 - momentum) * (1.0 + staleness))


@dataclass(frozen=True)
class Adjustment:
    """Scale every group's lr by `lr_scale`; lower heavy-ball momentum (SGD's `momentum`,
    Adam's beta1) for a mean staleness of `staleness` updates."""

    lr_scale: float = 1.0
    staleness: float = 0.0

    def apply(self, optimizer: torch.optim.Optimizer | None) -> list[dict[str, Any]]:
        """Set the optimizer's groups; return what each group now has (lr, momentum)."""
        if optimizer is None:
            return []
        applied = []
        for group in optimizer.param_groups:
            original = group.setdefault(ORIGINAL, _settings(group))
            now: dict[str, Any] = {}
            if "lr" in original:
                group["lr"] = now["lr"] = original["lr"] * self.lr_scale
            if "momentum" in original:
                group["momentum"] = now["momentum"] = explicit_momentum(
                    original["momentum"], self.staleness)
            if "betas" in original:
                beta1, beta2 = original["betas"]
                group["betas"] = (explicit_momentum(beta1, self.staleness), beta2)
                now["momentum"] = group["betas"][0]
            applied.append(now)
        return applied


def restore(optimizer: torch.optim.Optimizer | None) -> None:
    """Put back the settings the user gave (adapt_optimizer = false after an adjustment)."""
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        original = group.pop(ORIGINAL, None)
        if original is not None:
            group.update({k: (tuple(v) if k == "betas" else v) for k, v in original.items()})


def _settings(group: dict[str, Any]) -> dict[str, Any]:
    kept = {k: group[k] for k in ("lr", "momentum", "betas") if k in group}
    if isinstance(kept.get("lr"), torch.Tensor):  # a tensor lr: scale a copy of its value
        kept["lr"] = float(kept["lr"])
    if "betas" in kept:
        kept["betas"] = list(kept["betas"])
    return kept
