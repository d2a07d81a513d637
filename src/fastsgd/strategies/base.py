"""A strategy: how a worker's gradients or parameters meet its peers'.

`StrategyBase` is the class to subclass (`fastsgd.StrategyBase`), and its docstrings are the
contract: what a strategy must define, what it may, and what fastsgd does with each.
`Strategy` is the same contract as a typing Protocol, for a plain class that does not
subclass it. `check_codec` checks a strategy and a codec against each other at the start.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fastsgd.compress.base import Compressor
from fastsgd.config.objects import import_path
from fastsgd.config.options import Configurable, Option
from fastsgd.errors import UserError
from fastsgd.strategies.capabilities import Capabilities, capabilities_of, default_hook, hook
from fastsgd.transport.base import Transport

Params = list[torch.nn.Parameter]


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
    ended: bool = False  # set by `end`
    dropped: int = 0

    @property
    def last_step(self) -> bool:
        return self.total_steps is not None and self.step >= self.total_steps - 1

    def worked(self, share: float = 1.0) -> None:
        """This step's own work on the parameters (an average, an outer step) covered
        `share` of the model: the simulator charges the profiled time of the strategy's round
        over the whole model (`compute.strategy`) times `share`; real processes spend it."""
        self.transport.compute("strategy", self.step, share)

    def end(self, dropped: int = 0) -> None:
        """End this worker's training after the current step (a straggler the run does not
        wait for: async_diloco's quorum). Its parameters are final as they stand; its
        remaining steps are not trained (`idle_steps` in summary.json), though it still
        joins evaluations and checkpoints. `dropped`: its steps whose work did not reach
        the final model (`dropped_steps`)."""
        self.ended, self.dropped = True, dropped


class Strategy(Protocol):
    """What fastsgd calls on any strategy object; `StrategyBase` documents each."""

    name: str
    OPTIONS: dict[str, Option]

    def init(self, params: Params, ctx: Context) -> dict[str, Any]: ...

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None: ...

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None: ...

    def close(self) -> None: ...


class StrategyBase(Configurable, ABC, section="strategy"):
    """The base class of a strategy. `strategy.name = "module:Class"` runs a subclass, and
    `fastsgd.Job(strategy=Class(...))` an instance; either is checked when the job starts
    (strategies/contract.py), and a mistake ends it in one line naming the class.

    A strategy talks to its peers only through `ctx.transport` (real processes or the
    simulator alike). Its `state` holds tensors and numbers only, so a checkpoint is the
    state; runtime handles (hooks, handles in flight) live on the object, rebuilt by `init`.

    A subclass declares:

    - `name` (required, a str): what runs, summaries and reports call it.
    - `OPTIONS` (default {}): one `fastsgd.Option` for each argument of `__init__`, and
      none other. They become the `strategy.*` config keys; building the object checks its
      arguments as the config's keys are checked, and config.toml records them.
    - `capabilities` (default `Capabilities()`): how fastsgd treats it at the start, under
      faults and at the end (see `Capabilities` for every field and its default).

    It must define `init`, `on_gradients` and `on_parameters`; every other method below has
    a default that does nothing, and fastsgd skips a default it would call (`hook`).
    """

    name: str
    capabilities: Capabilities = Capabilities()

    @abstractmethod
    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        """Prepare for training `params` (the same on every worker; buffers included);
        return the state: a dict of tensors and numbers that a checkpoint saves and a
        resume gives back. Also called again, with the state kept, after the group shrank."""

    @abstractmethod
    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        """After backward, before the optimizer step: leave in each `p.grad` what the
        optimizer applies (e.g. the average of all workers' gradients)."""

    @abstractmethod
    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        """After the optimizer step: exchange or mix parameters, if the strategy does."""

    def close(self) -> None:
        """Release runtime handles (hooks, threads); called once the run ends, and before
        `init` is called again. Default: nothing to release."""

    @default_hook
    def settle(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        """Called on every worker before each checkpoint: finish the work in flight
        (messages answered and taken in), so that `state` is everything there is.
        Default: nothing in flight."""

    @default_hook
    def in_flight_state(self) -> Any:
        """Work held back between steps that is not in `state` (ssp's pending all-reduces),
        as tensors and numbers; a checkpoint saves it and a resume gives it back to
        `load_in_flight`. Define both or neither. Default: none (nothing saved)."""
        return None

    @default_hook
    def load_in_flight(self, saved: Any) -> None:
        """Take back what `in_flight_state` gave, on resume. Default: nothing to take."""

    @default_hook
    def donate(self, state: dict[str, Any]) -> dict[str, Any]:
        """With `capabilities.rejoins`: the state a live worker sends to a new one taking a
        lost worker's place (e.g. without what only the donor may keep). Default: `state`."""
        return state

    @default_hook
    def joined(self, step: int, params: Params) -> None:
        """In the new worker, once it holds the donor's state, before it trains `step`.
        Default: nothing to do."""

    @default_hook
    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        """The module the step runs forward through (ddp's DistributedDataParallel).
        Default: the model itself."""
        return model

    @default_hook
    def held_model(self, state: dict[str, Any]) -> torch.Tensor | None:
        """The model the method holds between its synchronizations, flat as the strategy's
        parameters (then buffers) lie, the same on every worker: what an evaluation in the
        middle of a round scores (DiLoCo's global model of the last outer step, which the
        papers evaluate), in place of the workers' average. Default: None (the average)."""
        return None

    @default_hook
    def check(self, world_size: int) -> None:
        """Raise UserError, in one line, where this object cannot run on `world_size`
        workers (a topology that does not fit); called before any worker starts."""

    @default_hook
    def check_compression(self, codec: Compressor, world_size: int) -> None:
        """Raise UserError where `codec` cannot carry this strategy's messages, beyond what
        `capabilities.codec_kinds` and `refused_codecs` say; called before training."""

    @default_hook
    def check_optimizer(self, optimizer: torch.optim.Optimizer, codec: Compressor) -> None:
        """Raise UserError where the optimizer (built on a probe parameter) cannot go with
        this strategy and codec; called before any worker starts."""


def label(strategy: object) -> str:
    """How a message names a strategy: a built-in's name, else its class's `module:Class`."""
    cls = strategy if isinstance(strategy, type) else type(strategy)
    if cls.__module__.startswith("fastsgd."):
        return str(getattr(strategy, "name", cls.__name__))
    return import_path(cls)


def check_codec(strategy: Strategy, codec: Compressor, world_size: int) -> None:
    """Fail early, naming both settings, when the strategy's messages cannot carry the codec:
    its kind is not in `capabilities.codec_kinds`, the strategy's own `check_compression`
    refuses it, or its name is in `capabilities.refused_codecs`."""
    capabilities = capabilities_of(strategy)
    named = f"compression.name = '{codec.name}'"
    if codec.kind not in capabilities.codec_kinds:
        fits = " or ".join(capabilities.codec_kinds)
        own = "" if type(strategy).__module__.startswith("fastsgd.") else (
            "; declare the kinds its messages carry in capabilities.codec_kinds")
        raise UserError(f"{named} ({codec.kind}) does not apply to strategy.name = "
                        f"'{label(strategy)}', which takes {fits} codecs{own}")
    own_check = hook(strategy, "check_compression")
    if own_check is not None:
        own_check(codec, world_size)
    if codec.name in capabilities.refused_codecs:
        raise UserError(f"{named} does not apply to strategy.name = '{label(strategy)}', "
                        "which refuses it (capabilities.refused_codecs)")


def scaled_period(paper: int, total_steps: int | None, rounds: int = 8) -> int:
    """A period of `paper` steps (a paper's H), but at least `rounds` rounds in a shorter
    run of `total_steps` (unknown: the paper's): what `period = 0` means for the strategies
    whose paper's period was set for runs of tens of thousands of steps."""
    if total_steps is None:
        return paper
    return min(paper, max(1, total_steps // rounds))
