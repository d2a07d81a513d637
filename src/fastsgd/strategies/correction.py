"""Momentum correction: a lossy codec carries the update the optimizer makes, not the gradient.

With momentum (or Adam's first moment) applied after a lossy all-reduce, the codec's error
feedback and the momentum compound each other: a residual fed back into the gradient is
amplified 1/(1-beta) times by the momentum, and sign-like codecs diverged at the synchronous
settings (onebit 68%, sign 50% against 87% uncompressed; issue 11). DGC's momentum correction
(Lin et al. 2018) instead compresses the momentum-accumulated velocity; Zheng et al. 2019
(dist-EF-SGDM) show error feedback on the local momentum update converges as momentum SGD
does. Generalized to any optimizer: each worker steps its own optimizer on its own gradient,
and the change that step made to its parameters travels through the codec, with error
feedback, and every worker applies the mean change from the shared starting point.

- Momentum SGD (Nesterov and weight decay included) is linear in the gradients: with a codec
  that loses nothing this is exactly momentum SGD on the averaged gradient (each worker's
  momentum buffer holds its own part of the global one); tested.
- Adam: the mean of the workers' Adam steps, each preconditioned by its own second moment
  (Adam's update, compressed as 1-bit Adam compresses its momentum after freezing the
  variance, Tang et al. 2021; here the variance is each worker's own and never frozen).
- A codec that applies momentum itself (dgc with `compression.momentum > 0`; by default dgc
  leaves it to the optimizer and sends its update) keeps compressing the gradient, as does
  PowerSGD under `auto`: its warm-started power iteration tracks the slowly changing gradient
  and its paper pairs error feedback on gradients with momentum after the all-reduce (Vogels
  et al. 2019); measured, gradients 86.65% against updates 85.39% (docs/compression.md).

What the codec holds back stays in the worker's own parameters (`keep_residual`, on by
default): each worker holds the shared parameters plus its own residual, the bifurcated local
models of CSER (Xie et al. 2020, without its periodic reset), and their mean is the virtual
iterate of error feedback, which moves by exactly the mean of the workers' updates. Without
it, a coordinate held back does not move on any worker, so its gradient and its momentum do
not change; the momentum saturates at g / (1 - beta) and the residual grows by that much
every step until the coordinate is sent. Random-k holds a coordinate back for d/k steps on
average and diverged at every ratio tried; with the residual kept, its own worker keeps
training on it, as local SGD does, and the burst it sends is an average, not an overshoot.
"""

from __future__ import annotations

import torch

from fastsgd.compress.base import Compressor
from fastsgd.errors import UserError

MODES = ("auto", "on", "off")


def has_momentum(optimizer: torch.optim.Optimizer) -> bool:
    """Heavy-ball momentum (SGD, RMSprop) or a first moment (Adam's betas[0])."""
    for group in optimizer.param_groups:
        betas = group.get("betas")
        if group.get("momentum", 0) or (betas is not None and betas[0] > 0):
            return True
    return False


def corrects(mode: str, optimizer: torch.optim.Optimizer | None, codec: Compressor) -> bool:
    """Whether the update is compressed rather than the gradient; `on` without momentum is
    refused (one line naming the key)."""
    lossy = codec.kind != "exact" and not getattr(codec, "momentum", 0)
    if mode == "off" or not lossy or (mode == "auto" and codec.kind == "lowrank"):
        return False
    known = optimizer is not None and has_momentum(optimizer)
    if mode == "on" and optimizer is not None and not known:
        raise UserError(f"strategy.momentum_correction = 'on' but the optimizer "
                        f"({type(optimizer).__name__}) has no momentum: set optimizer.momentum "
                        f"> 0, or momentum_correction = 'auto'")
    return mode == "on" or known
