"""`compute.model = "profile"`: time the job's own iteration on this machine, once.

The simulator then charges these fixed times, so a run repeats exactly; they are written into
the run's config.toml, so `fastsgd simulate runs/X/config.toml` charges the same times
without measuring again. Each time is the median of `repeat` steps after `warmup`, on a
throwaway copy of the model, with worker 0's batches; a step is a worker's: run.accumulate
forward and backward passes of data.batch_size (run.precision's), summed, then one update.

With the times, profile writes `compute.profiled`: what they were measured for (the keys
that change them, loop/fingerprint.py: the model, its step, its parameters' count and dtype,
the input's shape, the batch size, run.accumulate and run.precision, the optimizer but its
learning rate, the codec, the strategy) and the times themselves. A config whose times were
measured for another job (the same config.toml with another batch size) is profiled
again; another seed or number of workers keeps them, and another strategy measures only its
own round (`compute.strategy`: an average, an outer step, on one worker alone, charged per
share of the model a round covers: Context.worked) and another codec its encode and decode
(`compute.codec`), so strategies and codecs are compared on the same forward, backward and
update (so do a bench's cells: bench/profiles.py)."""

from __future__ import annotations

import copy
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from fastsgd.config import schema as cfg
from fastsgd.config.units import format_ns
from fastsgd.errors import UserError
from fastsgd.loop.checked_step import StepChecks
from fastsgd.loop.fingerprint import ADDED, but_exchange, fingerprint
from fastsgd.loop.kit.precision import Precision
from fastsgd.loop.plan import Plan
from fastsgd.loop.replica import Replica, replica_tensors
from fastsgd.strategies.params import flatten
from fastsgd.transport.base import Done
from fastsgd.transport.sim.compute import TIMES

KEYS = (*TIMES, "profiled")  # what profile writes into [compute]


def needs_profile(section: dict) -> bool:
    return section["model"] == "profile" and not all(section[k] for k in TIMES)


def profiled(plan: Plan) -> dict[str, Any]:
    """The `[compute]` keys profile writes for `plan` (none where its times are there and
    were measured for this job: a re-run repeats them exactly); says so in one line where
    they were measured for another job."""
    section = plan.config["compute"]
    measured_for = fingerprint(plan)
    if not needs_profile(section):
        if not section["profiled"]:  # a config written before compute.profiled: as it is
            return {}
        changed = _difference(section["profiled"], measured_for)
        if changed is None:
            return {}
        if _difference(but_exchange(section["profiled"]), but_exchange(measured_for)) is None:
            kept = {**{k: section[k] for k in TIMES}, **_exchange_times(plan, 3, 10)}
            return {**kept, "profiled": {**measured_for, **kept}}
        print(f"fastsgd: compute.profiled: the times were measured for {changed}; "
              "profiling again", file=sys.stderr, flush=True)
    times = profile(plan)
    return {**times, "profiled": {**measured_for, **times}}


def _difference(written: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first key of what the times were measured for that this run has otherwise (a
    key of ADDED that `written` lacks: its default)."""
    for key in [*now, *(k for k in written if k not in now and k not in TIMES)]:
        section, _, name = key.partition(".")
        was = written.get(key, cfg.SCHEMA[section][name].default if key in ADDED else None)
        if was != now.get(key):
            return f"{key} = {_shown(was)}, this run has {_shown(now.get(key))}"
    return None


def _shown(value: Any) -> str:
    return "nothing" if value is None else repr(value)


def profile(plan: Plan, warmup: int = 3, repeat: int = 10) -> dict[str, str]:
    """The `[compute]` keys of `plan`'s iteration, measured: forward, backward, update,
    codec (0 without compression) and reduce_bandwidth. On one intra-op thread, as the
    simulator computes and as a worker process runs (launch.py): a team of threads, one of
    them descheduled on a busy machine, stalled every op (a digits MLP's forward profiled
    at 31 ms instead of about 0.1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _profile(plan, warmup, repeat)
    finally:
        torch.set_num_threads(threads)


def _profile(plan: Plan, warmup: int, repeat: int) -> dict[str, str]:
    samples, model = _steps(plan, warmup, repeat)
    out = {phase: _time(statistics.median(s) if s else 0.0) for phase, s in samples.items()}
    flat = flatten(list(model.parameters()))
    out["codec"] = _time(_codec_seconds(plan, flat, warmup, repeat))
    vector = flat.clone()
    seconds = _median(lambda: vector.add_(flat), warmup, repeat)
    out["reduce_bandwidth"] = f"{round(flat.numel() * flat.element_size() / max(seconds, 1e-9))}B"
    return out


def _steps(plan: Plan, warmup: int, repeat: int) -> tuple[dict[str, list[float]],
                                                          torch.nn.Module]:
    """The seconds of each phase of `repeat` training steps after `warmup`, and the model.
    The strategy's round runs after each step's update on the very tensors the step has
    just written, as a worker's round does (its caches as training left them: on a 2-core
    Xeon a round on a copy of them cost 8-19% more, benchmarks/round_cache.py), through a
    twin of the model that shares them, so that the strategy's hooks (overlap's) stay off
    the model's backward.
    After the round the parameters go back to where the profile began: what a round does
    to them alone (an outer step) never reaches the next step's times or its checks."""
    torch.manual_seed(plan.config["run"]["seed"])
    model = plan.make_model()
    optimizer = plan.make_optimizer(model.parameters())
    shard = plan.shard(0, plan.config["run"]["workers"])
    samples: dict[str, list[float]] = {"forward": [], "backward": [], "update": [],
                                       "strategy": []}
    step = StepChecks(plan.step, list(model.parameters()), "profiling (compute.model = "
                      "'profile'): ")  # the workers' checks, before the run
    precision = Precision(plan.config["run"]["precision"], torch.device("cpu"))
    twin = _sharing(model)
    round_ = _strategy_round(plan, twin)
    start = [t.detach().clone() for t in replica_tensors(model)]
    for k in range(warmup + repeat):
        optimizer.zero_grad()
        seconds = _passes(model, step, precision, shard.batch(k),
                          plan.config["run"]["accumulate"])
        t0 = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - t0)
        if round_ is not None:
            seconds.append(_timed_round(round_, twin, model, start))
        if k >= warmup:
            for phase, took in zip(samples, seconds):
                samples[phase].append(took)
    return samples, model


def _passes(model: torch.nn.Module, step: StepChecks, precision: Precision,
            batch: tuple[torch.Tensor, torch.Tensor], accumulate: int) -> list[float]:
    """The seconds of a worker's forward passes and of its backward passes in one step (each
    summed): one of each per micro-batch of run.accumulate, weighed by its samples, as
    loop/kit/accumulate.py computes them."""
    x, y = batch
    parts = min(accumulate, len(x))
    forward = backward = 0.0
    for micro in zip(x.tensor_split(parts), y.tensor_split(parts)):
        t0 = time.perf_counter()
        with precision.autocast():
            loss = step(model, micro)
        t1 = time.perf_counter()
        precision.backward(loss * (len(micro[0]) / len(x)) if parts > 1 else loss)
        forward, backward = forward + t1 - t0, backward + time.perf_counter() - t1
    step.backward_done()
    return [forward, backward]


def _timed_round(round_: Callable[[], None], twin: torch.nn.Module, model: torch.nn.Module,
                 start: list[torch.Tensor]) -> float:
    """The seconds of one round on `model`'s tensors (and gradients) through `twin`; then
    the model's parameters go back to `start`."""
    for mine, theirs in zip(twin.parameters(), model.parameters()):
        mine.grad = theirs.grad
    t0 = time.perf_counter()
    round_()
    took = time.perf_counter() - t0
    with torch.no_grad():
        for tensor, value in zip(replica_tensors(model), start):
            tensor.copy_(value)
    return took


def _sharing(model: torch.nn.Module) -> torch.nn.Module:
    """A twin of `model` whose parameters and floating-point buffers are other objects
    over the same tensors: what the strategy does to them is done to the model's, while
    the hooks it registers on them never fire in the model's backward."""
    twin = copy.deepcopy(model)
    for mine, theirs in zip(replica_tensors(twin), replica_tensors(model)):
        mine.data = theirs.data
    return twin


def _strategy_round(plan: Plan, model: torch.nn.Module) -> Callable[[], None] | None:
    """The strategy's own work in a round over the whole model, on one worker alone: its
    hooks at the run's last step, where every strategy that averages or steps an outer
    optimizer does so over the whole model (drains_at_end), with the exact codec (the
    codec's time is compute.codec's). None for one that cannot run a round alone (a
    parameter server's, a gossip step's: what they do with a peer's message is
    reduce_bandwidth's)."""
    try:
        replica = Replica(model, _Alone(), copy.deepcopy(plan.strategy), total_steps=1)
    except (NotAlone, UserError):  # one that needs peers (or more than one worker)
        return None

    def round_() -> None:
        replica.ctx.step = 0
        replica.sync_gradients()
        replica.sync_parameters()
    try:
        round_()
    except (NotAlone, UserError):
        return None
    return round_


def _exchange_times(plan: Plan, warmup: int, repeat: int) -> dict[str, str]:
    """compute.strategy and compute.codec alone (another strategy or codec, the same job:
    its forward, backward and update are the profile's)."""
    rounds, model = _steps(plan, warmup, repeat)
    flat = flatten(list(model.parameters()))
    return {"strategy": _time(statistics.median(rounds["strategy"]) if rounds["strategy"]
                              else 0.0),
            "codec": _time(_codec_seconds(plan, flat, warmup, repeat))}


def _codec_seconds(plan: Plan, flat: torch.Tensor, warmup: int, repeat: int) -> float:
    codec = plan.compressor
    if codec.name == "none":
        return 0.0
    state = codec.init(flat)
    if codec.kind == "lowrank":  # PowerSGD: its products, without the all-reduces
        return _median(lambda: codec.all_reduce(flat, state, _Alone()), warmup, repeat)
    return _median(lambda: codec.decode(codec.encode(flat, state), flat), warmup, repeat)


class NotAlone(AttributeError):
    """What a strategy asked of `_Alone` needs a peer (an AttributeError: a strategy that
    looks for an optional method with getattr gets its default)."""


class _Alone:
    """A transport of one worker: collectives of one leave the tensors as they are; what
    needs a peer (a message, an exchange) raises NotAlone."""

    rank, world_size, device = 0, 1, torch.device("cpu")

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False,
                   average: bool = False) -> Done:
        return Done()  # a sum, or an average, of one

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [tensor.clone()]

    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False) -> Done:
        return Done()

    def members(self) -> list[int]:
        return [0]

    def compute(self, phase: str, step: int, share: float = 1.0) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        raise NotAlone(name)


def _median(fn: Callable[[], object], warmup: int, repeat: int) -> float:
    times = []
    for k in range(warmup + repeat):
        t0 = time.perf_counter()
        fn()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time(seconds: float) -> str:
    return format_ns(round(seconds * 1e6) * 1000)  # to the microsecond
