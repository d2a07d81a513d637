"""How long a simulated worker computes: the compute model (`[compute]`, docs/simulator.md).

- `profile` and `fixed` charge fixed times per phase (forward, backward, update, codec, and
  the strategy's own work: Context.worked), in
  integer nanoseconds, so a run is a pure function of its config and seed. Forward,
  backward and update are charged once an optimizer step: forward and backward (step_time)
  are the whole step's, all its run.accumulate micro-batches, as profile measures them;
  like data.batch_size, run.accumulate changes them where profile measures them again,
  not under fixed;
- `measured` charges the wall time the worker took (exploration only: not reproducible).

Heterogeneity multiplies a phase's time by a factor drawn from a random stream of its own per
(seed, worker, step), so it does not depend on the order the simulator runs workers in:
the worker's `slowdown`, a straggler draw (`straggler_prob`, `straggler_factor`) and
mean-one log-normal noise exp(sigma*z - sigma^2/2). A trace file (trace.py) adds each
worker's speed and the windows when it is available.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field

from fastsgd.config.units import parse_bandwidth, parse_seconds
from fastsgd.errors import ConfigError
from fastsgd.transport.sim.trace import Trace, load_trace

PHASES = ("forward", "backward", "update", "codec", "strategy")
TIMES = (*PHASES, "reduce_bandwidth")  # the keys profile measures
MODELS = ("profile", "fixed", "measured")


def to_ns(seconds: float) -> int:
    return round(seconds * 1e9)


@dataclass(frozen=True)
class Heterogeneity:
    """Per-worker, per-step compute factors (1 = the modeled time)."""

    slowdown: tuple[float, ...] = ()  # per rank; missing ranks are 1
    straggler_prob: float = 0.0
    straggler_factor: float = 4.0
    sigma: float = 0.0
    seed: int = 0

    def check(self, world_size: int) -> None:
        """Errors that depend on the number of workers (as Network.check's): a factor for
        a rank that does not exist would be ignored."""
        if len(self.slowdown) > world_size:
            raise ConfigError(f"compute.slowdown has {len(self.slowdown)} factors but "
                              f"run.workers = {world_size}: give at most one per worker "
                              "(missing ones are 1)")

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - frozen and small; asked once a phase
    def factor(self, rank: int, step: int) -> float:
        f = self.slowdown[rank] if rank < len(self.slowdown) else 1.0
        if self.straggler_prob == 0 and self.sigma == 0:
            return f
        draw = random.Random(f"compute/{self.seed}/{rank}/{step}")  # sha512 of the string
        if draw.random() < self.straggler_prob:
            f *= self.straggler_factor
        if self.sigma:
            f *= math.exp(draw.gauss(0.0, self.sigma) - self.sigma ** 2 / 2)
        return f


@dataclass(frozen=True)
class ComputeModel:
    """Phase times in nanoseconds (`times`), or None for `measured`; `reduce_bandwidth`
    (bytes/s) prices adding a received vector into one's own (a server applying a push,
    a gossip worker mixing a neighbour's model): 0 = free."""

    kind: str = "measured"
    times: dict[str, int] = field(default_factory=dict)
    reduce_bandwidth: float = 0.0
    spread: Heterogeneity = Heterogeneity()
    trace: Trace | None = None

    @classmethod
    def free(cls) -> ComputeModel:
        """Compute takes no virtual time (tests of the network model)."""
        return cls("fixed", dict.fromkeys(PHASES, 0))

    @property
    def deterministic(self) -> bool:
        return self.kind != "measured"

    def factor(self, rank: int, step: int, now_ns: int) -> float:
        speed = self.trace.speed(rank, now_ns) if self.trace else 1.0
        return self.spread.factor(rank, step) / speed

    def phase_ns(self, phase: str, rank: int, step: int, now_ns: int) -> int:
        base = self.times.get(phase, 0)
        return round(base * self.factor(rank, step, now_ns)) if base else 0

    def reduce_ns(self, nbytes: int) -> int:
        return to_ns(nbytes / self.reduce_bandwidth) if self.reduce_bandwidth else 0

    def available_ns(self, rank: int, now_ns: int) -> int:
        """The first time >= now when `rank` may compute (its trace's windows)."""
        return self.trace.available(rank, now_ns) if self.trace else now_ns


def heterogeneity(section: dict, seed: int) -> Heterogeneity:
    """The `[compute]` keys that make workers differ (they act on real processes too); their
    draws are seeded by compute.seed, or by `seed` (the run's) where that is -1."""
    own = section.get("seed", -1)
    return Heterogeneity(tuple(float(f) for f in section["slowdown"]),
                         section["straggler_prob"], section["straggler_factor"],
                         section["sigma"], seed if own < 0 else own)


def by_hand(section: dict, keys: tuple[str, ...] = TIMES) -> list[str]:
    """The keys of `keys` that are set, less those profile wrote (compute.profiled holds
    what it wrote: a key that says the same is the profile's)."""
    written = section["profiled"]
    return [k for k in keys if section[k] and section[k] != written.get(k)]


def check_times(section: dict) -> None:
    """Which timing keys each compute.model takes (one line naming the key otherwise):
    fixed charges step_time, or forward and backward; profile measures them all, and a
    time set by hand would be replaced by the measurement; measured charges the wall time."""
    kind, hand = section["model"], by_hand(section)
    if section["step_time"] and kind != "fixed":
        raise ConfigError(f"compute.step_time applies to compute.model = 'fixed' (forward + "
                          f"backward); under '{kind}' it would be ignored")
    phases = [k for k in hand if k in PHASES]
    if kind == "measured" and phases:
        raise ConfigError(f"compute.{phases[0]} applies to compute.model = 'fixed'; "
                          "'measured' charges the wall time the worker took")
    # written before profiled (and before the strategy's time)
    legacy = not section["profiled"] and set(hand) >= set(TIMES) - {"strategy"}
    if kind == "profile" and hand and not legacy:
        raise ConfigError(f"compute.{hand[0]} = '{section[hand[0]]}' is not a time profile "
                          "measured (compute.profiled): compute.model = 'profile' would replace "
                          "it with the measurement; to give the times, set compute.model = "
                          "'fixed'")
    if kind == "fixed":
        _check_fixed(section, hand)


def _check_fixed(section: dict, hand: list[str]) -> None:
    step = section["step_time"]
    if step:
        if to_ns(parse_seconds(step, "compute.step_time")) <= 0:
            raise ConfigError(f"compute.step_time must be > 0 (at least 1ns), got '{step}' "
                              "(no compute time: compute.forward = compute.backward = '0s')")
        both = [k for k in ("forward", "backward") if k in hand]
        if both:
            raise ConfigError(f"compute.step_time and compute.{both[0]} are both set: "
                              "step_time is forward + backward, give one or the other")
    elif not (section["forward"] and section["backward"]):
        missing = "forward" if not section["forward"] else "backward"
        raise ConfigError("compute.model = 'fixed' needs compute.step_time (e.g. 25ms), or "
                          f"compute.forward and compute.backward (compute.{missing} is not set)")


def compute_model(section: dict, seed: int) -> ComputeModel:
    """The compute model a `[compute]` section describes (profile's times filled in).
    Under fixed, step_time (a whole optimizer step's forward + backward, whatever
    run.accumulate) replaces forward and backward that profile wrote."""
    check_times(section)
    kind = section["model"]
    times = {p: to_ns(parse_seconds(section[p], f"compute.{p}")) if section[p] else 0
             for p in PHASES}
    if kind == "fixed" and section["step_time"]:
        step = to_ns(parse_seconds(section["step_time"], "compute.step_time"))
        times["forward"], times["backward"] = step // 3, step - step // 3  # backward ~ 2x
    if kind == "profile" and not all(section[k] for k in TIMES):
        raise ConfigError("compute.model = 'profile' needs its measured times: "
                          "Job.simulate profiles the job first")
    rate = section["reduce_bandwidth"]
    return ComputeModel(kind, times if kind != "measured" else {},
                        parse_bandwidth(rate, "compute.reduce_bandwidth") if rate else 0.0,
                        heterogeneity(section, seed),
                        load_trace(section["trace"]) if section["trace"] else None)
