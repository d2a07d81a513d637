"""The Strategy protocol: how a worker's gradients or parameters meet its peers'.

A strategy talks only to `ctx.transport` (real processes or the simulator alike). Its
`state` holds tensors and numbers only, so a checkpoint is the state; runtime handles
(hooks, handles in flight) live on the strategy object and are rebuilt by `init`. A strategy
that keeps work in flight between steps finishes it in the optional `settle(params, state,
ctx)`, which every worker calls before a checkpoint (messages answered and taken in), and
says what else it keeps with `in_flight_state()`, taken back by `load_in_flight(saved)`;
one that cannot be resumed yet sets `CHECKPOINTS = False`, and runs refuse to checkpoint it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fastsgd.compress.base import Compressor
from fastsgd.config.options import Option
from fastsgd.errors import UserError
from fastsgd.transport.base import Transport


@dataclass
class Context:
    """What a strategy may use: the transport, the codec, the step number (and the last one,
    when known, so that a strategy can drain what it holds back); `stats` is where it reports
    per-step figures the worker logs (e.g. `staleness`)."""

    transport: Transport
    compressor: Compressor
    step: int = 0
    total_steps: int | None = None
    stats: dict[str, float] = field(default_factory=dict)
    score: Callable[[], float] | None = None  # loss of the current parameters on a sample
    optimizer: torch.optim.Optimizer | None = None  # the worker's, when known (correction.py)

    @property
    def last_step(self) -> bool:
        return self.total_steps is not None and self.step >= self.total_steps - 1


CODEC_KINDS = ("exact", "quantize", "sparse", "lowrank")  # see compress/base.py


class Strategy(Protocol):
    name: str
    OPTIONS: dict[str, Option]
    CODEC_KINDS: tuple[str, ...]  # the kinds of codec its messages can carry

    def init(self, params: list[torch.nn.Parameter], ctx: Context) -> dict[str, Any]:
        """Prepare for training `params`; return the strategy's state."""
        ...

    def on_gradients(self, params: list[torch.nn.Parameter], state: dict[str, Any],
                     ctx: Context) -> None:
        """After backward, before the optimizer: leave in `p.grad` what the optimizer applies."""
        ...

    def on_parameters(self, params: list[torch.nn.Parameter], state: dict[str, Any],
                      ctx: Context) -> None:
        """After the optimizer step: exchange or mix parameters if the strategy does."""
        ...

    def close(self) -> None:
        """Release runtime handles (hooks)."""
        ...


def check_codec(strategy: Strategy, codec: Compressor, world_size: int) -> None:
    """Fail early, naming both settings, when the strategy's messages cannot carry the codec
    (a strategy may add its own test, `check_compression(codec, world_size)`)."""
    kinds = getattr(strategy, "CODEC_KINDS", CODEC_KINDS)
    if codec.kind not in kinds:
        fits = " or ".join(kinds)
        raise UserError(f"compression.name = '{codec.name}' ({codec.kind}) does not apply to "
                        f"strategy.name = '{strategy.name}', which takes {fits} codecs")
    own_check = getattr(strategy, "check_compression", None)
    if own_check is not None:
        own_check(codec, world_size)
