"""The simulator's side of Job.simulate: the compute model, the compute lanes, and the
simulated run itself (see transport/sim/)."""

from __future__ import annotations

import torch

from fastsgd import config as cfg
from fastsgd import interrupt
from fastsgd.checked_step import StepChecks
from fastsgd.errors import Interrupted
from fastsgd.observe import EvalLog, Observer
from fastsgd.plan import Plan
from fastsgd.profiling import needs_profile, profile
from fastsgd.transport.sim import ComputeModel, Faults, Network, load_trace, simulate
from fastsgd.transport.sim.compute import compute_model
from fastsgd.transport.sim.lanes import ahead_for, cores, draws_random
from fastsgd.worker import train


def check_compute(section: dict, workers: int, seed: int) -> None:
    """Bad `[compute]` input fails before the run directory exists (one line)."""
    if section["trace"]:
        load_trace(section["trace"]).check(workers)
    if not needs_profile(section):
        compute_model(section, seed)


def simulate_plan(plan: Plan, compute: ComputeModel | None, net: Network,
                  faults: Faults) -> None:
    """Train the plan's workers on the virtual clock; the `[compute]` section is profiled
    first where it asks to be (the times go into the run's config.toml)."""
    n, seed = plan.config["run"]["workers"], plan.config["run"]["seed"]
    if compute is None and needs_profile(plan.config["compute"]):
        plan.config = cfg.merged(plan.config, compute=profile(plan))
    model = compute or compute_model(plan.config["compute"], seed)
    plan.observer = Observer(n, plan.config["run"]["representative"],
                             lambda m: plan.evaluate(m, plan.dataset, torch.device("cpu")),
                             EvalLog(plan.run_dir / "eval.jsonl",
                                     plan.config["run"]["target_accuracy"]))
    lanes, ahead = compute_lanes(plan, model)
    with interrupt.simulated(n) as stop:
        simulate(n, lambda t: train(plan, t), net, model, faults, plan.observer.crashed,
                 plan.total_steps(n), lanes, ahead)
    if 0 < stop.stop_at.value < plan.total_steps(n):  # Ctrl-C: checkpoints written
        step = stop.stop_at.value
        raise Interrupted(f"interrupted: every worker stopped after step {step} and wrote "
                          f"a checkpoint; resume with: fastsgd simulate --resume "
                          f"{plan.run_dir}", step)


def compute_lanes(plan: Plan, compute: ComputeModel) -> tuple[int, int]:
    """Compute lanes for a simulation and how far ahead they may compute
    (transport/sim/lanes.py): none where the order of computing would change the run
    (measured compute, workers that share their parameters, a step that draws random
    numbers)."""
    lanes = plan.config["compute"]["lanes"]
    lanes = cores() if lanes < 0 else lanes
    if not lanes or not compute.deterministic or getattr(plan.strategy, "HOST_MEMORY", False):
        return 0, 0
    with torch.random.fork_rng(devices=[]):
        model = plan.make_model()
        batch = plan.shard(0, plan.config["run"]["workers"]).batch(0)
        step = StepChecks(plan.step, list(model.parameters()), "model.step, tried before "
                          "the simulation: ")  # the workers' checks, before any worker
        if draws_random(lambda: step(model, batch)):
            return 0, 0
    return lanes, ahead_for(model, lanes)
