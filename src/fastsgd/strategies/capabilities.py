"""What a strategy declares about itself, and the one way fastsgd reads it.

A strategy class declares `capabilities = Capabilities(...)` (a frozen value; an instance
whose capabilities depend on its options sets its own in `__init__`, as diloco does). Every
part of fastsgd reads it with `capabilities_of(strategy)`, which also reads the class
attributes of a plain class that does not subclass `StrategyBase` (CODEC_KINDS, CARRIES_ON,
... as fastsgd before 0.2 read them), and a strategy's optional methods with `hook`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from fastsgd.compress.base import KINDS
from fastsgd.config.objects import described

# The optional methods a strategy may define, and how fastsgd calls them (base.py says what
# each is for). `hook` gives a strategy's own, or None where it has none.
HOOKS = {"settle": "(params, state, ctx)", "in_flight_state": "()",
         "load_in_flight": "(saved)", "donate": "(state)", "joined": "(step, params)",
         "wrap": "(model, ctx)", "check": "(world_size)",
         "check_compression": "(codec, world_size)", "check_optimizer": "(optimizer, codec)",
         "held_model": "(state)"}


@dataclass(frozen=True)
class Capabilities:
    """How fastsgd treats a strategy at the start of a run, under faults and at its end.
    Each field has a default; declare only those that differ.

    - `codec_kinds` (default `("exact",)`): the kinds of codec (`compression.name`'s `kind`:
      exact, quantize, sparse, lowrank) that the strategy's messages carry through
      `ctx.compressor`. A run with a codec of another kind is refused before training
      starts. The default is exact only, the uncompressed `none`: a strategy that never
      passes its messages through `ctx.compressor` would otherwise be labelled with a codec
      it ignores. Declare every kind your code passes through the codec.
    - `refused_codecs` (default `()`): codec names refused although their kind is carried
      (diloco refuses dgc, whose momentum correction adds a second momentum).
    - `carries_on` (default `()`): the codec kinds with which the survivors go on without a
      lost worker: in the simulator, `[faults] crash` is refused for other kinds; on real
      processes it also takes `carries_on_real` or `shrinks_real`.
    - `carries_on_real` (default False): on real processes the workers wait for no
      collective while training, so that the survivors carry on past a dead one (with a
      kind in `carries_on`, `run.checkpoint_every = 0`, `run.on_failure` not "stop").
    - `shrinks_real` (default False): on real processes (gloo) a synchronous strategy goes
      on in a smaller group without a dead worker (`run.on_failure = "shrink"` or "stop";
      with a kind in `carries_on`).
    - `rejoins` (default `()`): the codec kinds with which a new worker takes a lost one's
      place from a live worker's state (`run.rejoin`, `run.join`; the `donate` and `joined`
      hooks shape that state).
    - `drains_at_end` (default False): the strategy finishes its work on the last step
      (`ctx.last_step`): it averages, or takes in what is still on the wire.
      `fastsgd.Replica` warns when it is not told the number of steps.
    - `async_drain` (default False): the workers do not wait for one another while training
      (or only within a bound, as ssp's staleness), and the drain on the last step waits
      for the slowest: there a fast worker waits for being faster. summary.json's
      `samples_per_second` then leaves that wait (how far ahead of the slowest its
      second-to-last step ended) out of each worker's time; its own queued messages stay.
      False (lockstep and periodic strategies, whose last step holds a synchronization that
      is part of the method's cost, and those with no drain): every step, over the clock
      when the last one ended. (ssp, ps, sgp, adpsgd and async_diloco declare it.)
    - `checkpoints` (default True): False: the strategy cannot be resumed (what it keeps
      between steps is not all in its state), and a run with `run.checkpoint_every > 0` is
      refused at the start; the conformance suite skips its resume check.
    - `real_only` (default False): it runs on real processes only; `fastsgd simulate`
      refuses it (ddp).
    - `host_memory` (default False): the workers share their parameters in host memory
      (hogwild): `run.backend = "auto"` picks gloo, and the simulator computes the workers
      one after another (no compute lanes).
    """

    codec_kinds: tuple[str, ...] = ("exact",)
    refused_codecs: tuple[str, ...] = ()
    carries_on: tuple[str, ...] = ()
    carries_on_real: bool = False
    shrinks_real: bool = False
    rejoins: tuple[str, ...] = ()
    drains_at_end: bool = False
    async_drain: bool = False
    checkpoints: bool = True
    real_only: bool = False
    host_memory: bool = False

    def __post_init__(self) -> None:
        for field in fields(self):  # a list is taken as the tuple it stands for
            value = getattr(self, field.name)
            if isinstance(value, list):
                object.__setattr__(self, field.name, tuple(value))

    def problem(self, spelled: Callable[[str], str] = lambda f: f"capabilities.{f}") -> str | None:
        """The first field of the wrong type or with an unknown codec kind, in words (each
        field named as `spelled` writes it); None if all are right."""
        for field in fields(self):
            value, named = getattr(self, field.name), spelled(field.name)
            if field.type == "bool" and not isinstance(value, bool):
                return f"has {named} = {value!r} ({described(value)}): it must be True or False"
            if field.type == "tuple[str, ...]":
                found = _tuple_problem(field.name, value)
                if found:
                    return f"has {named} = {value!r}: {found}"
        return None


def _tuple_problem(field: str, value: Any) -> str | None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        what = "codec names" if field == "refused_codecs" else "codec kinds"
        return f"it must be a tuple of {what}, e.g. (\"exact\",)"
    unknown = [v for v in value if v not in KINDS] if field != "refused_codecs" else []
    if unknown:
        return f"{unknown[0]!r} is not a codec kind ({', '.join(KINDS)})"
    return None


# What fastsgd before 0.2 read from a strategy class, still read from a class that does not
# declare `capabilities`: field -> class attribute.
LEGACY = {field.name: field.name.upper() for field in fields(Capabilities)}


def capabilities_of(strategy: object) -> Capabilities:
    """A strategy's (a class's or an instance's) capabilities: its `capabilities`, or for a
    class that declares none, its old upper-case class attributes (CODEC_KINDS, CARRIES_ON,
    CARRIES_ON_REAL, SHRINKS_REAL, REJOINS, DRAINS_AT_END, ASYNC_DRAIN, CHECKPOINTS,
    REAL_ONLY, HOST_MEMORY, REFUSED_CODECS), each default where it has none."""
    declared = getattr(strategy, "capabilities", None)
    if isinstance(declared, Capabilities):
        return declared
    return Capabilities(**{field: getattr(strategy, name) for field, name in LEGACY.items()
                           if hasattr(strategy, name)})


def legacy_flags(strategy: object) -> list[str]:
    """The old upper-case flags a strategy (class or instance) sets."""
    return [name for name in LEGACY.values() if hasattr(strategy, name)]


def default_hook(method: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a StrategyBase method as the default of an optional hook (it does nothing), so
    that `hook` tells a strategy that keeps it from one that has its own."""
    method.__fastsgd_default__ = True  # type: ignore[attr-defined]
    return method


def hook(strategy: object, name: str) -> Callable[..., Any] | None:
    """The strategy's own optional method `name` (one of HOOKS), bound; None where it has
    none, or keeps StrategyBase's default, which does nothing: the caller then skips it (a
    checkpoint holds no `in_flight`, a donor sends the state as it is)."""
    if name not in HOOKS:
        raise ValueError(f"{name!r} is not a strategy hook; the hooks: {', '.join(HOOKS)}")
    found = getattr(strategy, name, None)
    if found is None or getattr(getattr(found, "__func__", found), "__fastsgd_default__", False):
        return None
    return found
