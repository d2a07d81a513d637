"""DiLoCo and Streaming DiLoCo: local training, then an outer optimizer on the mean change.

- `diloco` (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of
  Language Models", Algorithm 1): every worker runs the user's optimizer (the inner one,
  AdamW in the paper) for `period` steps (H, 500 in the paper; `period` = 0, the default,
  is 500 but at least eight rounds in a shorter run: min(500, steps // 8)). Then the outer step: the
  pseudo-gradient is the mean over workers of (global parameters - the worker's
  parameters), the global parameters being where every worker started the period; the outer
  optimizer, SGD with Nesterov momentum (`outer_lr` 0.7, `outer_momentum` 0.9, the paper's
  values), steps the global parameters with it, exactly as `torch.optim.SGD(nesterov=True)`
  would: m <- mu m + g; global <- global - lr (g + mu m). Every worker restarts from the new
  global parameters. Each worker's inner optimizer keeps its own state across rounds.
- Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping
  communication: Towards a Distributed Free Lunch", Section 2): `fragments` = P splits the
  parameter tensors into P contiguous groups of about equal size (the paper also tries a
  strided layout, which it finds a little better on transformers; here the groups are
  contiguous). Fragment p syncs on its own schedule, shifted by p H / P steps: after step s
  when (s + 1 - floor(p H / P)) % H == 0, so each fragment still syncs once per H steps
  but only 1/P of the model is on the wire at a time (the peak bandwidth falls by P).
  `overlap` = tau lets a fragment's sync be in flight for tau inner steps: its
  pseudo-gradient is taken after step s, the workers keep training, and the outer step
  lands after step s + tau, where the worker merges the new global fragment into the one
  it trained meanwhile: local <- alpha local + (1 - alpha) global (the paper's merge,
  alpha = 0.5 its default). With tau = 0 the worker takes the global fragment (DiLoCo).

After the last step (ctx.last_step) every sync in flight lands and then every fragment syncs
at once, restarting all workers from the global parameters: the replicas end identical.

The pseudo-gradient crosses the wire in any codec whose collective can average it
(compress/collectives.py `all_reduce_mean`): fp16/bf16, the quantizers (`qsgd` with
`levels`, `onebit`, `sign`), sparse (`topk`, `randomk`) and `powersgd`, each fragment with its
own codec state (error feedback's residual where the codec keeps one: onebit, sign, topk,
randomk and powersgd by default, qsgd only with `error_feedback = true`, fp16/bf16 never).
Floating-point buffers (BatchNorm's running statistics) bypass the codec: an exact all-reduce
beside it, as `allreduce` averages them, so every worker restarts from their exact mean (a
codec's error there, e.g. qsgd's noise, could take a running variance below zero, and error
feedback would carry statistics from round to round). `dgc` is refused: its
momentum correction is a second momentum on top of the outer Nesterov momentum, and its
sparsity warm-up counts messages as if they were steps. With the exact codec an overlapped
sync is a background all-reduce (`transport.all_reduce(async_op=True)`) waited for tau steps
later; a lossy codec's collective does not run in the background: its mean is computed after
step s and applied after step s + tau, which is the same arithmetic (as `ssp` does).

State (plain tensors, so it checkpoints): `global` (the flat global parameters), `momentum`
(the outer momentum buffer), and with a lossy codec `codec`, one codec state per fragment
(of its parameters: not of its buffers).
A sync in flight is a runtime handle, as in `ssp`: it is not part of the state (save a
checkpoint where no sync is in flight, e.g. with `overlap = 0`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from fastsgd.compress.base import KINDS, Compressor
from fastsgd.compress.collectives import init_all_reduce
from fastsgd.config.options import Option, at_least, between, positive
from fastsgd.errors import ConfigError, UserError
from fastsgd.strategies.base import Context, StrategyBase, scaled_period
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.params import buffer_mask, coded, flatten, lossy_mean
from fastsgd.transport.base import Done, Handle

Params = list[torch.nn.Parameter]
PAPER_PERIOD = 500  # H in Douillard et al. 2023


def _below_one(v: float) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


class DiLoCo(StrategyBase):
    name = "diloco"
    capabilities = Capabilities(
        drains_at_end=True,  # lands every sync in flight and syncs everything (ctx.last_step)
        codec_kinds=KINDS,
        refused_codecs=("dgc",),  # momentum correction: a second momentum on the pseudo-grad
        # shrinks with exact codecs: the outer step takes the survivors' mean (see __init__)
        carries_on=("exact",),
        shrinks_real=True)  # where carries_on allows: also on real processes (recovery.py)
    OPTIONS = {
        "period": Option(int, 0, at_least(0), "inner steps between outer steps (H; 0: the "
                         "paper's 500, at least 8 rounds in a shorter run)", steps=True),
        "outer_lr": Option(float, 0.7, positive, "outer (Nesterov SGD) learning rate"),
        "outer_momentum": Option(float, 0.9, between(0, 0.999), "outer momentum"),
        "nesterov": Option(bool, True, doc="Nesterov outer momentum (false: heavy ball)"),
        "fragments": Option(int, 1, at_least(1),
                            "Streaming DiLoCo: fragments synced on staggered schedules"),
        "overlap": Option(int, 0, at_least(0),
                          "Streaming DiLoCo: inner steps a sync is in flight (tau < period)"),
        "alpha": Option(float, 0.5, _below_one,
                        "with overlap: weight of the local fragment when a sync lands"),
    }

    def __init__(self, period: int = 0, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, fragments: int = 1, overlap: int = 0,
                 alpha: float = 0.5):
        self._check_overlap(overlap, period or PAPER_PERIOD)
        self.period, self.outer_lr, self.momentum = period, outer_lr, outer_momentum
        self._period = period or PAPER_PERIOD  # H (init scales period 0 to the run)
        self.nesterov, self.fragments, self.overlap, self.alpha = (nesterov, fragments,
                                                                   overlap, alpha)
        self._groups: list[tuple[int, int]] = []  # fragment -> [first, last) parameter index
        self._slices: list[tuple[int, int]] = []  # fragment -> [start, end) in the flat vector
        self._in_flight: dict[int, tuple[int, int, torch.Tensor, Handle]] = {}  # started, lands
        # a sync in flight across steps (overlap) holds a handle, which no checkpoint keeps,
        # and it cannot shrink then, nor with fragments, whose round can fail halfway (one
        # fragment's outer step taken, the next one's not)
        if overlap or fragments > 1:
            self.capabilities = replace(DiLoCo.capabilities, carries_on=(),
                                        checkpoints=overlap == 0)

    @staticmethod
    def _check_overlap(overlap: int, period: int) -> None:
        if overlap >= period:
            raise ConfigError(f"strategy.overlap must be < strategy.period ({period}), "
                              f"got {overlap}")

    def check_compression(self, codec: Compressor, world_size: int) -> None:
        if codec.name in self.capabilities.refused_codecs:
            raise UserError(f"compression.name = '{codec.name}' cannot carry the pseudo-"
                            f"gradient of strategy.name = '{self.name}': its momentum "
                            "correction adds a second momentum to the outer one; choose "
                            "topk, qsgd, fp16, ...")

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        if self.fragments > len(params):
            raise ConfigError(f"strategy.fragments must be <= the model's {len(params)} "
                              f"parameter tensors, got {self.fragments}")
        self.check_compression(ctx.compressor, ctx.transport.world_size)
        self._period = self.period or scaled_period(PAPER_PERIOD, ctx.total_steps)
        self._check_overlap(self.overlap, self._period)
        self._in_flight.clear()
        sizes = [p.numel() for p in params]
        self._groups = split(sizes, self.fragments)
        starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self._slices = [(starts[a], starts[b]) for a, b in self._groups]
        start = flatten(params)  # every replica starts from rank 0's parameters
        self._buffers = buffer_mask(params)
        # fragment -> which of its elements are buffers (None: none are)
        self._plain = [None if self._buffers is None or not self._buffers[a:b].any()
                       else self._buffers[a:b] for a, b in self._slices]
        state: dict[str, Any] = {"global": start, "momentum": torch.zeros_like(start)}
        if ctx.compressor.kind != "exact":
            n = ctx.transport.world_size
            parts = [coded(start[a:b], plain) for plain, (a, b) in zip(self._plain, self._slices)]
            state["codec"] = [init_all_reduce(ctx.compressor, c, n) if c.numel() else {}
                              for c in parts]  # {}: a fragment of buffers only
        return state

    def held_model(self, state: dict[str, Any]) -> torch.Tensor:
        """The global model of the last outer step (streaming: of each fragment's last),
        which the papers evaluate; mid-round the workers' average is no model DiLoCo holds."""
        return state["global"]

    def offset(self, fragment: int) -> int:
        """Fragment p's schedule is shifted by floor(p H / P) steps."""
        return fragment * self._period // self.fragments

    def due(self, fragment: int, step: int) -> bool:
        """Fragment `fragment` starts a sync after step `step` (0-based)."""
        return (step + 1 - self.offset(fragment)) % self._period == 0

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        for f, (_, lands, _, _) in sorted(self._in_flight.items()):
            if lands == ctx.step or ctx.last_step:
                self._land(f, params, state, ctx)
        for f in range(self.fragments):
            if ctx.last_step or self.due(f, ctx.step):
                delay = 0 if ctx.last_step else self.overlap
                self._start(f, params, state, ctx, delay)
                if delay == 0:
                    self._land(f, params, state, ctx)

    def _start(self, f: int, params: Params, state: dict[str, Any], ctx: Context,
               delay: int) -> None:
        """Take fragment f's pseudo-gradient and start averaging it over the workers; the
        outer step lands `delay` steps later."""
        a, b = self._slices[f]
        pseudo = state["global"][a:b] - self._local(f, params)
        if "codec" in state:  # the mean, now
            mean = lossy_mean(pseudo, self._plain[f], ctx, state["codec"][f])
            self._in_flight[f] = (ctx.step, ctx.step + delay, mean, Done())
        else:  # the sum, in the background while `delay` inner steps run
            handle = ctx.transport.all_reduce(pseudo, async_op=delay > 0)
            self._in_flight[f] = (ctx.step, ctx.step + delay, pseudo, handle)

    def _land(self, f: int, params: Params, state: dict[str, Any], ctx: Context) -> None:
        """The outer step on fragment f; the worker's fragment then moves to the result."""
        started, _, mean, handle = self._in_flight.pop(f)
        handle.wait()
        ctx.worked(mean.numel() / state["global"].numel())  # this fragment's share
        if "codec" not in state:
            mean = mean / len(ctx.transport.members())  # the survivors, once one is lost
        a, b = self._slices[f]
        momentum, global_ = state["momentum"][a:b], state["global"][a:b]
        workers_mean = global_ - mean
        momentum.mul_(self.momentum).add_(mean)
        update = mean + self.momentum * momentum if self.nesterov else momentum
        global_.sub_(update, alpha=self.outer_lr)
        if self._buffers is not None:  # no outer step: the workers' mean (params.buffer_mask)
            plain = self._buffers[a:b]
            global_[plain], momentum[plain] = workers_mean[plain], 0
        if started == ctx.step:
            self._assign(f, params, global_)
        else:  # overlapped: the worker trained meanwhile; the paper's merge
            self._assign(f, params, self.alpha * self._local(f, params)
                         + (1 - self.alpha) * global_)

    def _local(self, f: int, params: Params) -> torch.Tensor:
        first, last = self._groups[f]
        return torch.cat([p.detach().reshape(-1) for p in params[first:last]])

    def _assign(self, f: int, params: Params, flat: torch.Tensor) -> None:
        first, last = self._groups[f]
        offset = 0
        with torch.no_grad():
            for p in params[first:last]:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def close(self) -> None:
        self._in_flight.clear()


def split(sizes: list[int], parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous, non-empty groups of the tensors whose sizes are `sizes`, as
    [first, last) index pairs, each cut where the running total is nearest an equal share."""
    n, total = len(sizes), sum(sizes)
    running = [sum(sizes[:i]) for i in range(n + 1)]
    cuts = [0]
    for k in range(1, parts):
        target = k * total / parts
        low, high = cuts[-1] + 1, n - (parts - k)  # leave a tensor for every later group
        cuts.append(min(range(low, high + 1), key=lambda i: (abs(running[i] - target), i)))
    cuts.append(n)
    return list(zip(cuts[:-1], cuts[1:]))
