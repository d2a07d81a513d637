"""The properties every strategy and codec must have, each checked on the tiny job.

Each check returns None when the property holds and raises AssertionError with one line
naming the strategy, the codec and the property when it does not.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from fastsgd.loop.replica import Replica
from fastsgd.records import checkpoint
from fastsgd.testing.tiny import (
    TinyJob,
    bitwise_equal,
    largest_difference,
    parameters,
)
from fastsgd.transport.sim import ComputeModel, simulate
from fastsgd.workloads.data import Shard, load_dataset
from fastsgd.workloads.models import build_model


def fail(job: TinyJob, prop: str, why: str) -> AssertionError:
    return AssertionError(f"{job.name} fails '{prop}': {why}")


def determinism(job: TinyJob) -> None:
    """Two simulated runs of one config give the same bits: model.pt and metrics.jsonl
    (losses, bytes, virtual times), once with every worker computed on the scheduler's
    thread and once on two compute lanes beside it (another order in wall time)."""
    first = job.simulate("determinism-a", **{"compute.lanes": 0}).run_dir
    second = job.simulate("determinism-b", **{"compute.lanes": 2}).run_dir
    a, b = parameters(first), parameters(second)
    if not bitwise_equal(a, b):
        raise fail(job, "determinism", "two simulated runs of the same config end with other "
                   f"parameters (largest difference {largest_difference(a, b):.3g}); draw "
                   "randomness from the step and rank, not from wall time or shared state")
    if (first / "metrics.jsonl").read_bytes() != (second / "metrics.jsonl").read_bytes():
        raise fail(job, "determinism", "two simulated runs of the same config write other "
                   "metrics.jsonl (losses, bytes or virtual times differ)")


def resume(job: TinyJob) -> None:
    """A run resumed from its checkpoint halfway equals the run that never stopped: the
    same model.pt and metrics.jsonl, bit for bit."""
    steps = job.options["run.steps"]
    half = steps // 2
    straight = job.simulate("straight", **{"run.checkpoint_every": half}).run_dir
    if half not in checkpoint.steps(straight):
        raise fail(job, "resume", f"no complete checkpoint at step {half} of {straight}")
    resumed = job.folder / "resumed"
    shutil.copytree(straight, resumed)
    for step in checkpoint.steps(resumed):  # as if it had stopped right after step `half`
        if step > half:
            shutil.rmtree(checkpoint.step_dir(resumed, step))
    for name in ("summary.json", "model.pt"):  # what only a finished run has
        (resumed / name).unlink()
    job.resume("resumed").simulate()
    a, b = parameters(straight), parameters(resumed)
    if not bitwise_equal(a, b):
        raise fail(job, "resume", f"resumed from the checkpoint of step {half}, the run ends "
                   f"with other parameters (largest difference {largest_difference(a, b):.3g})"
                   "; its state (or in_flight_state) misses something it keeps between steps")
    if (straight / "metrics.jsonl").read_bytes() != (resumed / "metrics.jsonl").read_bytes():
        raise fail(job, "resume", f"resumed from the checkpoint of step {half}, the run writes "
                   "other metrics.jsonl than the run that never stopped")


def ends_cleanly(job: TinyJob, run_dir: Path) -> None:
    """Every worker did every step and the run wrote its summary."""
    from fastsgd.loop.results import result_of

    result = result_of(run_dir)
    steps, workers = job.options["run.steps"], job.options["run.workers"]
    if result.summary is None:
        raise fail(job, "drain", f"the run wrote no summary.json in {run_dir}")
    if result.summary["lost_workers"]:
        raise fail(job, "drain", f"workers were lost: {result.summary['lost_workers']}")
    done = {(m["rank"], m["step"]) for m in result.metrics()}
    missing = [(r, k) for r in range(workers) for k in range(1, steps + 1) if (r, k) not in done]
    if missing:
        rank, step = missing[0]
        raise fail(job, "drain", f"worker {rank} recorded no step {step} in metrics.jsonl")


def drain(job: TinyJob) -> None:
    """At the end nothing is in flight: once every worker has done its last step (the
    strategy told which one it is, `ctx.total_steps`), no message waits on the wire or in a
    mailbox and no worker is left blocked. Trained through `Replica` in the simulator, whose
    fabric sees every message."""
    steps, workers = job.options["run.steps"], job.options["run.workers"]
    data = load_dataset("digits")

    def worker(t: Any) -> int:
        torch.manual_seed(0)
        model = build_model("mlp", data.input_shape, data.num_classes)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        replica = Replica(model, t, job.strategy.make(), job.codec.make(),
                          total_steps=steps, optimizer=optimizer)
        shard = Shard(data.train_x, data.train_y, 16, t.rank, t.world_size, 0)
        try:
            for k in range(steps):
                x, y = shard.batch(k)
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(replica.forward_module(x), y)
                loss.backward()
                replica.sync_gradients()
                optimizer.step()
                replica.sync_parameters()
            t.barrier()  # every worker is past its last step
            return t.fabric.in_flight()
        finally:
            replica.close()

    left = simulate(workers, worker, compute=ComputeModel.free())
    if any(n is None for n in left):
        raise fail(job, "drain", f"worker {left.index(None)} did not finish its last step")
    if any(left):
        raise fail(job, "drain", f"{max(left)} message(s) still in flight after every worker's "
                   "last step; take in what is still coming on the last step (ctx.last_step) "
                   "and declare capabilities.drains_at_end")


def real_equals_simulated(job: TinyJob, tolerance: float) -> None:
    """Real processes (gloo on this machine) train what the simulator trains: parameters
    within `tolerance`, the same bytes sent. Holds for strategies whose arithmetic does not
    depend on timing (not for asynchronous ones: ps, hogwild, adpsgd, sgp)."""
    simulated = job.simulate("simulated")  # first: the workers forked next inherit what it
    real = job.real("real")  # loaded (a codec's compiled loops), instead of each loading it
    ends_cleanly(job, real.run_dir)
    difference = largest_difference(parameters(real.run_dir), parameters(simulated.run_dir))
    if not difference <= tolerance:
        raise fail(job, "real equals simulated", f"real processes end {difference:.3g} away "
                   f"from the simulator's parameters (tolerance {tolerance:g})")
    sent = real.summary["bytes_sent_total"], simulated.summary["bytes_sent_total"]
    if sent[0] != sent[1]:
        raise fail(job, "real equals simulated", f"real processes sent {sent[0]} bytes, the "
                   f"simulator counted {sent[1]}")
