"""NoLoCo: DiLoCo's local steps, then an outer step with ONE random peer, no all-reduce.

Kolehmainen, Blagoev, Donaghy, Ersoy & Nies (Gensyn, 2025), "NoLoCo: No-all-reduce Low
Communication Training Method for Large Models" (arXiv 2506.10911). Every worker i runs the
user's optimizer (the inner one) for `period` steps (H) from its outer parameters phi_i,
reaching theta_i. Then the outer step of round t: the workers are split into pairs G, a
random perfect matching drawn from a torch.Generator seeded with `seed * 1_000_003 + s`
(s: the step the round ends on), so every worker knows every pair without a word:
`torch.randperm(n)` read two by two. With an odd count the worker drawn last is alone for
the round (its group is itself: the step below with no peer, no correction). Each worker
takes the paper's modified Nesterov step with its pair's means:

    Delta_i = phi_i - theta_i                            (outer pseudo-gradient)
    delta_i <- alpha delta_i - beta mean_{j in G} Delta_j - gamma (phi_i - mean_{j in G} phi_j)
    phi_i   <- phi_i + delta_i;   theta_i <- phi_i       (the next inner steps start there)

with beta = `outer_lr` 0.7, alpha = `outer_momentum` 0.5 and gamma = `correction` 0.7, the
values of the authors' NoLoCo runs (their code, jkolehm/noloco, ties gamma to beta; H = 50
there). In a pair {i, j} the step only needs w_j = gamma phi_j - beta Delta_j from the peer:
delta_i <- alpha delta_i - beta Delta_i + (w_j - w_i) / 2, which is the rule above, so ONE
model-sized vector crosses the wire each way per round (no collective). The (w_j - w_i) / 2
terms of a pair cancel, so over the workers the mean of the outer parameters moves by the
mean step: mean phi <- mean phi + mean delta, mean delta <- alpha mean delta - beta mean
Delta, a heavy-ball DiLoCo step on the mean. With 2 workers the pair is everyone, the phi
stay equal and NoLoCo is DiLoCo with momentum alpha, lr beta and no Nesterov look-ahead.
Floating-point buffers (BatchNorm's running statistics) take no outer step: they become the
pair's mean (params.buffer_mask).

`period` 0 (the default) scales H to the run: min(50, max(1, steps // 8)), at least eight
rounds (50, the authors' H, from 400 steps on); without a known step count, 50. After the
last step (ctx.last_step) a last round runs, and with `average_at_end` (the default) one
all-reduce replaces every replica by the mean of the outer parameters, so the run ends in
consensus; `false` keeps each worker's own phi.

Codecs: the exact one only. What crosses the wire is at the scale of the parameters
themselves (gamma phi), and pairs change every round, so there is no copy both ends share to
send a small change against. Lost workers: the survivors carry on in the simulator. A
worker whose peer is known lost, or is found lost during the exchange, takes the step alone
(as with an odd count); the pairing is still drawn over all ranks, so it stays the same on
every worker whatever each knows of the losses. The mean invariant then holds among the
survivors except in the round a worker is lost. On real processes it restarts (not declared:
untested there).

State (plain tensors, so it checkpoints): `outer` (phi_i, flat) and `momentum` (delta_i).
"""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.config.options import Option, at_least, between, positive
from fastsgd.strategies.base import Context, StrategyBase, scaled_period
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.membership import gone_at
from fastsgd.strategies.params import assign, buffer_mask, flatten
from fastsgd.transport.base import PeerLost

Params = list[torch.nn.Parameter]
SEED_STRIDE = 1_000_003  # seed * SEED_STRIDE + step seeds the pairing of that step's round
AUTHORS_PERIOD = 50  # the authors' H


class NoLoCo(StrategyBase):
    name = "noloco"
    capabilities = Capabilities(
        carries_on=("exact",),  # a worker whose peer is lost steps alone (docstring)
        drains_at_end=True)  # a last round and the average after the last step
    OPTIONS = {
        "period": Option(int, 0, at_least(0), "inner steps between outer steps (H; 0: "
                         "min(50, steps // 8), at least 1)"),
        "outer_lr": Option(float, 0.7, positive, "outer learning rate (beta)"),
        "outer_momentum": Option(float, 0.5, between(0, 0.999), "outer momentum (alpha)"),
        "correction": Option(float, 0.7, at_least(0),
                             "weight of the pull toward the pair's mean outer parameters "
                             "(gamma)"),
        "seed": Option(int, 0, doc="seed of the pairings (with the step number)"),
        "average_at_end": Option(bool, True, doc="average the replicas after the last "
                                 "round (false: each keeps its own)"),
    }

    def __init__(self, period: int = 0, outer_lr: float = 0.7, outer_momentum: float = 0.5,
                 correction: float = 0.7, seed: int = 0, average_at_end: bool = True):
        self.period, self.outer_lr, self.momentum = period, outer_lr, outer_momentum
        self.correction, self.seed, self.average_at_end = correction, seed, average_at_end
        self._period = period or AUTHORS_PERIOD
        self._buffers: torch.Tensor | None = None

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        self._period = self.period or scaled_period(AUTHORS_PERIOD, ctx.total_steps)
        self._buffers = buffer_mask(params)
        start = flatten(params)  # every replica starts from rank 0's parameters
        return {"outer": start, "momentum": torch.zeros_like(start)}

    def peer(self, rank: int, world_size: int, step: int) -> int | None:
        """Rank's peer in the round that ends after step `step`; None: it is alone."""
        generator = torch.Generator().manual_seed(self.seed * SEED_STRIDE + step)
        order = torch.randperm(world_size, generator=generator).tolist()
        place = order.index(rank) ^ 1  # positions 2k and 2k + 1 are a pair
        return order[place] if place < world_size else None

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if not (ctx.last_step or (ctx.step + 1) % self._period == 0):
            return
        phi, delta = state["outer"], state["momentum"]
        theta = flatten(params)
        pseudo = phi - theta
        mine = self.correction * phi - self.outer_lr * pseudo
        if self._buffers is not None:  # buffers: the pair's mean of theta (below)
            mine[self._buffers] = theta[self._buffers]
        theirs = self._swap(mine, ctx)
        delta.mul_(self.momentum).sub_(pseudo, alpha=self.outer_lr)
        delta.add_(theirs - mine, alpha=0.5)
        phi.add_(delta)
        if self._buffers is not None:
            phi[self._buffers] = (mine[self._buffers] + theirs[self._buffers]) / 2
            delta[self._buffers] = 0
        if ctx.last_step and self.average_at_end:
            ctx.transport.all_reduce(phi, average=True)  # the survivors' mean
        assign(params, phi)
        ctx.worked()

    def _swap(self, mine: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The peer's w (its gamma phi - beta Delta), or this worker's own where it is alone
        this round: its peer drawn last with an odd count, known lost, or lost now."""
        t = ctx.transport
        peer = self.peer(t.rank, t.world_size, ctx.step)
        if peer is None or peer in gone_at(t, ctx.step):
            return mine
        try:
            return t.exchange([(peer, mine)], [peer], mine)[peer]
        except PeerLost:
            return mine

    def close(self) -> None:
        return None

