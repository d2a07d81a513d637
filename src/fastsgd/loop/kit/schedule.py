"""The learning rate over a run: a pure function of the global step (optimizer.schedule,
warmup, min_lr, decay_every, decay_factor), applied to each param group before every
optimizer step.

Being a function of the step and the run's length, a resumed run sets the same rates with
no state of its own in the checkpoint. Each group keeps its own base rate (`initial_lr`,
read once at the start, after a strategy's adjustment of it, staleness.py), so a user's
groups of different rates keep their ratios. Only the worker's optimizer is scheduled: an
outer optimizer a strategy keeps (diloco's outer_lr, bmuf's block_lr) stays as configured.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fastsgd.errors import ConfigError

BASE = "initial_lr"  # the key torch's LR schedulers keep a group's base rate under


def factor(k: int, total: int, section: dict[str, Any], min_ratio: float = 0.0) -> float:
    """What step `k` (0-based, of `total`) multiplies each group's base lr by. Warmup rises
    linearly over the first `warmup` steps (1/warmup at the first, 1 at its last); then the
    schedule runs over the steps left: linear and cosine end at `min_ratio` (min_lr / lr)
    on the last step, step multiplies by decay_factor every decay_every steps."""
    warmup = section.get("warmup", 0)
    if k < warmup:
        return (k + 1) / warmup
    name = section.get("schedule", "constant")
    left = total - warmup  # steps after warmup, k - warmup of them done
    done = k - warmup
    if name == "step":
        every = section.get("decay_every", 0) or max(1, math.ceil(left / 3))  # three levels
        return section.get("decay_factor", 0.1) ** (done // every)
    if name == "constant":
        return 1.0
    progress = min(1.0, done / (left - 1)) if left > 1 else 1.0
    shape = 1.0 - progress if name == "linear" else (1.0 + math.cos(math.pi * progress)) / 2
    return min_ratio + (1.0 - min_ratio) * shape


def check(section: dict[str, Any], total: int) -> None:
    """A warmup longer than the run never reaches optimizer.lr, and a decay to a min_lr
    above it would climb: refused in one line."""
    lr, floor = section.get("lr"), section.get("min_lr", 0.0)
    if lr is not None and floor > lr and section.get("schedule", "constant") != "constant":
        raise ConfigError(f"optimizer.min_lr = {floor} is above optimizer.lr = {lr}: the "
                          f"'{section['schedule']}' schedule would raise the learning rate")
    warmup = section.get("warmup", 0)
    if warmup > total:
        raise ConfigError(f"optimizer.warmup = {warmup} is longer than the run ({total} "
                          "steps): the learning rate would never reach optimizer.lr; lower "
                          "it or train longer")


class Schedule:
    """The [optimizer] section's schedule for a run of `total` steps, set on an optimizer."""

    def __init__(self, section: dict[str, Any], total: int):
        check(section, total)
        self.section, self.total = section, total
        # a constant rate without warmup leaves the groups untouched (a user's tensor lr too)
        self.active = section.get("warmup", 0) > 0 or section.get("schedule",
                                                                   "constant") != "constant"
        self.min_ratio = 0.0

    def start(self, optimizer: torch.optim.Optimizer) -> None:
        """Keep each group's base rate (once: a rejoined or resumed group keeps its own);
        min_lr is a rate for optimizer.lr (an imported optimizer's: its first group's)."""
        if not self.active:
            return
        for group in optimizer.param_groups:
            group.setdefault(BASE, float(group["lr"]))
        lr = self.section.get("lr") or optimizer.param_groups[0][BASE]
        self.min_ratio = self.section.get("min_lr", 0.0) / lr if lr else 0.0

    def apply(self, optimizer: torch.optim.Optimizer, k: int) -> None:
        """Set every group's lr for step `k`."""
        if not self.active:
            return
        f = factor(k, self.total, self.section, self.min_ratio)
        for group in optimizer.param_groups:
            lr = group[BASE] * f
            if isinstance(group["lr"], torch.Tensor):  # a tensor lr (capturable) stays one
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
