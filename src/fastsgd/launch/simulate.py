"""The simulator's side of Job.simulate: the compute model, the compute lanes, and the
simulated run itself (see transport/sim/). What runs is what the run's config.toml says:
a Network or ComputeModel given to Job.simulate is written into it as its keys."""

from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path
from typing import Any

import torch

from fastsgd.config import schema as cfg
from fastsgd.config.units import format_bandwidth, format_ns, format_seconds
from fastsgd.control import interrupt
from fastsgd.control.crashes import building_model
from fastsgd.errors import ConfigError, Interrupted, UserError, WorkerFailed
from fastsgd.launch.forking import REPORT_CHARS
from fastsgd.launch.supervise import placed
from fastsgd.loop.checked_step import StepChecks
from fastsgd.loop.observe import EvalLog, Observer, target_of
from fastsgd.loop.plan import Plan
from fastsgd.loop.profiling import needs_profile, profiled
from fastsgd.loop.worker import train
from fastsgd.strategies import CHOICES, capabilities_of
from fastsgd.strategies.membership import first_expendable
from fastsgd.transport.sim import ComputeModel, Faults, Network, SimAborted, load_trace, simulate
from fastsgd.transport.sim.compute import PHASES, check_times, compute_model
from fastsgd.transport.sim.faults import Survival
from fastsgd.transport.sim.lanes import ahead_for, cores, draws_random
from fastsgd.transport.sim.transport import SimTransport


def check_faults(faults: Faults, strategy: object, codec: Any, config: dict) -> None:
    """Refuse, in one line, the [faults] this strategy and codec cannot carry on through
    (their capabilities: carries_on, rejoins; the ranks none may lose)."""
    capabilities = capabilities_of(strategy)
    faults.check_steps(config["run"]["steps"] or 1 << 62)
    faults.check_run(Survival(str(getattr(strategy, "name", "?")), codec.name, codec.kind,
                              capabilities.carries_on, capabilities.rejoins,
                              first_expendable(strategy)), config)


def prepared(config: dict, network: Network | None,
             compute: ComputeModel | None) -> tuple[dict, Network]:
    """The config a simulation runs and its config.toml records, and the network it says:
    objects given to Job.simulate written as their keys (one line where one cannot be),
    compute.trace made absolute. Bad input fails here, before the run directory exists."""
    seed, n = config["run"]["seed"], config["run"]["workers"]
    if network is not None:
        config = _recorded(config, "network", network, network_section(network, seed))
    if compute is not None:
        config = _recorded(config, "compute", compute, compute_section(compute, seed))
    if config["compute"]["trace"]:  # relative to the working directory, as data.path is
        trace = str(Path(config["compute"]["trace"]).resolve())
        config = cfg.merged(config, CHOICES, compute={"trace": trace})
    net = network_of(config)
    if network is not None:
        _same("network", network, net, [f.name for f in dataclasses.fields(Network)])
    net.check(n)
    check_compute(config["compute"], n, seed)
    if compute is not None:
        _same("compute", compute, compute_model(config["compute"], seed),
              ["kind", "times", "reduce_bandwidth", "spread", "trace"])
    return config, net


def network_of(config: dict) -> Network:
    """The `[network]` section's network; network.seed -1 is the run's seed."""
    section = dict(config["network"])
    own = section.pop("seed")
    return Network.parse(**section, seed=config["run"]["seed"] if own < 0 else own)


def check_compute(section: dict, workers: int, seed: int) -> None:
    """Bad `[compute]` input fails before the run directory exists (one line)."""
    check_times(section)
    if section["trace"]:
        load_trace(section["trace"]).check(workers)
    if not needs_profile(section):
        compute_model(section, seed)


def simulate_plan(plan: Plan, net: Network, faults: Faults) -> None:
    """Train the plan's workers on the virtual clock; the `[compute]` section is profiled
    first where it asks to be (the times go into the run's config.toml)."""
    n, seed = plan.config["run"]["workers"], plan.config["run"]["seed"]
    if plan.config["compute"]["model"] == "profile":
        plan.config = cfg.merged(plan.config, CHOICES, compute=_profiled(plan))
    model = compute_model(plan.config["compute"], seed)
    plan.observer = Observer(n, plan.config["run"]["representative"],
                             lambda m: plan.evaluate(m, plan.dataset, torch.device("cpu")),
                             EvalLog(plan.run_dir / "eval.jsonl",
                                     target_of(plan.config["run"], plan.dataset.kind),
                                     plan.dataset.kind))
    lanes, ahead = compute_lanes(plan, model)
    with interrupt.simulated(n) as stop:
        try:
            simulate(n, lambda t: _worker(plan, t), net, model, faults,
                     plan.observer.crashed, plan.total_steps(n), lanes, ahead)
        except WorkerFailed as e:  # a worker's bug (_worker, transport/sim/collective.py),
            raise placed(e, plan) from e  # in one line with its step and the strategy
    if 0 < stop.stop_at.value < plan.total_steps(n):  # Ctrl-C: checkpoints written
        step = stop.stop_at.value
        raise Interrupted(f"interrupted: every worker stopped after step {step} and wrote "
                          f"a checkpoint; resume with: fastsgd simulate --resume "
                          f"{plan.run_dir}", step)


def _worker(plan: Plan, t: SimTransport) -> Any:
    """One simulated worker, whose error is told as `fastsgd run` tells a worker process's
    (launch/forking.py, Told): WorkerFailed with its rank, the step it was in (or
    "while building its model") and its traceback, which is the user's code's. Not a user
    error (one line already), nor the simulator's own ending of a worker (SimAborted)."""
    try:
        return train(plan, t)
    except (SimAborted, UserError, WorkerFailed):
        raise
    except Exception as e:  # noqa: BLE001 - told as the worker's failure
        if building_model(traceback.format_exc()):
            raise _failed(e, f"worker {t.rank} failed while building its model",
                          t.rank) from None
        step = max(t.fabric.progress[t.rank], interrupt.steps_done(t.rank) or 0) + 1
        raise _failed(e, f"worker {t.rank} failed", t.rank, step) from None


def _profiled(plan: Plan) -> dict[str, Any]:
    """compute.model = "profile": the times of the plan's model and step, measured here
    (loop/profiling.py); where the user's model or step raises, one line says so."""
    try:
        return profiled(plan)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code raised
        raise _failed(e, 'compute.model = "profile": the model or step raised while being '
                      "profiled") from None


def _failed(e: Exception, head: str, rank: int | None = None,
            step: int | None = None) -> WorkerFailed:
    """`e`, being handled, told as a run tells a worker's error: `head`, the exception in
    a line, then its traceback (as long as forking.py sends)."""
    trace = traceback.format_exc()[-REPORT_CHARS[1]:]
    message = f"{type(e).__name__}: {e}"[:REPORT_CHARS[0]]
    return WorkerFailed(f"{head}: {message}\n{trace}", rank=rank, step=step)


def network_section(net: Network, seed: int) -> dict[str, Any]:
    """`net` as `[network]` keys (its seed -1 where it is the run's `seed`)."""
    return {"bandwidth": format_bandwidth(net.bandwidth), "latency": format_seconds(net.latency),
            "jitter": format_seconds(net.jitter), "seed": -1 if net.seed == seed else net.seed,
            "workers_per_node": net.workers_per_node,
            "intra_bandwidth": format_bandwidth(net.intra_bandwidth),
            "intra_latency": format_seconds(net.intra_latency),
            "bandwidths": {str(r): format_bandwidth(b) for r, b in net.bandwidths},
            "loss": net.loss, "rto": format_seconds(net.rto), "mtu": net.mtu}


def compute_section(model: ComputeModel, seed: int) -> dict[str, Any]:
    """`model` as `[compute]` keys (compute.lanes stays the config's)."""
    if model.kind not in ("fixed", "measured"):
        raise ConfigError(f"Job.simulate(compute=ComputeModel('{model.kind}', ...)): give "
                          "'fixed' times or 'measured'; for this job's own profile leave "
                          "compute out (compute.model = 'profile')")
    fixed, spread, rate = model.kind == "fixed", model.spread, model.reduce_bandwidth
    times = {p: _ns(model.times.get(p, 0)) if fixed else "" for p in PHASES}
    return {"model": model.kind, "step_time": "", **times, "profiled": {},
            "reduce_bandwidth": format_bandwidth(rate) if rate else "",
            "slowdown": list(spread.slowdown), "straggler_prob": spread.straggler_prob,
            "straggler_factor": spread.straggler_factor, "sigma": spread.sigma,
            "seed": -1 if spread.seed == seed else spread.seed,
            "trace": str(Path(model.trace.path).resolve()) if model.trace else ""}


def _recorded(config: dict, section: str, given: object, values: dict[str, Any]) -> dict:
    try:
        return cfg.merged(config, CHOICES, **{section: values})
    except ConfigError as e:
        raise ConfigError(f"Job.simulate({section}={type(given).__name__}(...)): {e}; give "
                          f"it as [{section}] keys instead") from None


def _same(section: str, given: Any, rebuilt: Any, fields: list[str]) -> None:
    """What the recorded keys describe is what was given (else the run's config.toml
    would say another run)."""
    for name in fields:
        ours, theirs = getattr(given, name), getattr(rebuilt, name)
        if name == "times":  # measured charges none of them
            ours, theirs = ([t.get(p, 0) if given.kind == "fixed" else 0 for p in PHASES]
                            for t in (ours, theirs))
        elif name == "trace" and ours is not None and theirs is not None:
            ours, theirs = ours.windows, theirs.windows  # its path, made absolute
        if ours != theirs:
            raise ConfigError(f"Job.simulate({section}={type(given).__name__}(...)): its "
                              f"{name} cannot be written as [{section}] keys; give them as "
                              "keys instead")


def _ns(value: Any) -> str:
    return format_ns(value) if isinstance(value, int) else f"{value!r}ns"


def compute_lanes(plan: Plan, compute: ComputeModel) -> tuple[int, int]:
    """Compute lanes for a simulation and how far ahead they may compute
    (transport/sim/lanes.py): none where the order of computing would change the run
    (measured compute, workers that share their parameters, a step that draws random
    numbers, a model or step that raises: the workers tell that)."""
    lanes = plan.config["compute"]["lanes"]
    lanes = cores() if lanes < 0 else lanes
    if not lanes or not compute.deterministic or capabilities_of(plan.strategy).host_memory:
        return 0, 0
    with torch.random.fork_rng(devices=[]):
        try:
            model = plan.make_model()
            batch = plan.shard(0, plan.config["run"]["workers"]).batch(0)
            step = StepChecks(plan.step, list(model.parameters()), "model.step, tried "
                              "before the simulation: ")  # the workers' checks, before any
            if draws_random(lambda: step(model, batch)):
                return 0, 0
        except UserError:
            raise
        except Exception:  # noqa: BLE001 - the user's model or step raised: no lanes; the
            return 0, 0  # workers meet it again and tell it as a run's would (_worker)
    return lanes, ahead_for(model, lanes)
