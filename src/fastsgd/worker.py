"""The per-worker loop: batch -> forward -> backward -> strategy -> optimizer -> metrics.

The same loop runs in a real process (TorchTransport) and as a simulated worker
(SimTransport); all its timings come from `transport.now()`, wall or virtual.
"""

from __future__ import annotations

import copy
import math
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fastsgd.compress import Compressor
from fastsgd.config import slowdown_of, to_toml
from fastsgd.data import Dataset, Shard, test_batches
from fastsgd.errors import UserError
from fastsgd.metrics import PHASES, JsonLines, write_json
from fastsgd.progress import Progress
from fastsgd.replica import Replica
from fastsgd.representative import representative
from fastsgd.rundir import environment, host_names
from fastsgd.strategies import Strategy
from fastsgd.transport.base import Transport

Batch = tuple[torch.Tensor, torch.Tensor]
StepFn = Callable[[torch.nn.Module, Batch], torch.Tensor]
EvalFn = Callable[[torch.nn.Module, Dataset, torch.device], tuple[float, float]]


def cross_entropy_step(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The default iteration: classification with cross-entropy."""
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def evaluate_classifier(model: torch.nn.Module, dataset: Dataset,
                        device: torch.device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on the test split."""
    was_training = model.training
    model.eval()
    correct, loss, count = 0, 0.0, 0
    for x, y in test_batches(dataset.test_x, dataset.test_y):
        logits = model(x.to(device))
        y = y.to(device)
        correct += int((logits.argmax(1) == y).sum())
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        count += len(y)
    model.train(was_training)
    return correct / count, loss / count


@dataclass
class Plan:
    """Everything a worker needs to train; built by `Job`, shared by all workers."""

    config: dict[str, Any]
    run_dir: Path
    dataset: Dataset
    make_model: Callable[[], torch.nn.Module]
    make_optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    step: StepFn
    evaluate: EvalFn
    strategy: Strategy
    compressor: Compressor
    simulated: bool = False
    progress: bool = True

    def total_steps(self, world_size: int) -> int:
        run = self.config["run"]
        if run["steps"]:
            return run["steps"]
        return max(1, math.ceil(run["epochs"] * self.shard(0, world_size).steps_per_epoch))

    def shard(self, rank: int, world_size: int) -> Shard:
        """Worker `rank`'s slice of every global batch."""
        ds = self.dataset
        return Shard(ds.train_x, ds.train_y, self.config["data"]["batch_size"], rank,
                     world_size, self.config["run"]["seed"])


def train(plan: Plan, transport: Transport) -> dict[str, Any] | None:
    """Train one worker; rank 0 returns the run summary, the others None."""
    torch.manual_seed(plan.config["run"]["seed"])
    model = plan.make_model().to(transport.device)
    optimizer = plan.make_optimizer(model.parameters())
    replica = Replica(model, transport, copy.deepcopy(plan.strategy),
                      copy.deepcopy(plan.compressor), total_steps=plan.total_steps(
                          transport.world_size))
    try:
        return _Loop(plan, replica, optimizer).run()
    finally:
        replica.close()


class _Loop:
    def __init__(self, plan: Plan, replica: Replica, optimizer: torch.optim.Optimizer):
        self.plan, self.replica, self.optimizer = plan, replica, optimizer
        self.model = replica.model
        self.t = replica.transport
        self.rank, self.world = self.t.rank, self.t.world_size
        self.shard = plan.shard(self.rank, self.world)
        self.steps = plan.total_steps(self.world)
        run = plan.config["run"]
        self.eval_every, self.target = run["eval_every"], run["target_accuracy"]
        self.metrics = JsonLines(plan.run_dir / "metrics.jsonl")
        self.log_every = run["log_every"]
        self.evals = JsonLines(plan.run_dir / "eval.jsonl", flush_every=1)
        self.sent = self.received = 0
        self.eval_time = self.eval_wall = 0.0  # on the run's clock, and wall seconds
        self.evaluations = 0
        self.time_to_target: float | None = None
        self.last_eval: tuple[int, float, float, float] | None = None  # rank 0 only
        self.evaluated: tuple[int, torch.nn.Module | None] = (0, None)  # step, representative
        self.slowdown = slowdown_of(plan.config, self.rank)
        replica.ctx.score = lambda: self.score(self.model, own=True)
        self.progress = Progress(self.steps, enabled=plan.progress and self.rank == 0)

    def run(self) -> dict[str, Any] | None:
        self.record_environment()
        self.t.barrier()  # everyone starts the clock together (setup is not training time)
        self.t.off_clock()
        self.start, wall = self.t.now(), time.perf_counter()
        for k in range(self.steps):
            loss = self.step(k)
            if self.eval_every and (k + 1) % self.eval_every == 0:
                self.evaluate(k + 1)
            self.progress.update(k + 1, loss, self.last_eval and self.last_eval[1])
        self.metrics.flush()
        self.progress.close()
        return self.finish(time.perf_counter() - wall - self.eval_wall)

    def record_environment(self) -> None:
        """config.toml (what ran) and environment.json (where, with what) in the run dir."""
        simulated = self.plan.simulated
        hosts = [socket.gethostname()] if simulated else host_names(self.t)
        if self.rank == 0:
            (self.plan.run_dir / "config.toml").write_text(to_toml(self.plan.config))
            backend = "simulated" if simulated else str(torch.distributed.get_backend())
            write_json(self.plan.run_dir / "environment.json", environment(backend, hosts))

    def clock(self) -> float:
        """Seconds of training so far (wall, or virtual in the simulator), evaluation
        excluded."""
        return self.t.now() - self.start - self.eval_time

    def step(self, k: int) -> float:
        now, t = self.clock, self.t
        sent, received = t.bytes_sent, t.bytes_received
        t0 = now()
        x, y = self.shard.batch(k)
        t1 = now()
        x, y = x.to(t.device, non_blocking=True), y.to(t.device, non_blocking=True)
        t2 = now()
        self.optimizer.zero_grad()
        loss = self.plan.step(self.model, (x, y))
        t3 = now()
        loss.backward()
        if self.slowdown > 1 and not self.plan.simulated:  # the simulator scales it itself
            time.sleep((self.slowdown - 1) * (now() - t2))
        t4 = now()
        self.replica.sync_gradients()
        t5 = now()
        self.optimizer.step()
        t6 = now()
        self.replica.sync_parameters()
        t7 = now()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise UserError(f"loss is {value} at step {k} on worker {self.rank}: "
                            "training diverged (lower optimizer.lr?)")
        if k == self.steps - 2:
            self.penultimate = t7
        self.sent += t.bytes_sent - sent
        self.received += t.bytes_received - received
        if (k + 1) % self.log_every == 0 or k + 1 == self.steps:
            timings = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, (t5 - t4) + (t7 - t6), t6 - t5)
            self.metrics.write({
                "step": k + 1, "rank": self.rank, "time": t7, "loss": value,
                **dict(zip(PHASES, timings)),
                "bytes_sent": t.bytes_sent - sent, "bytes_received": t.bytes_received - received,
                "staleness": self.replica.ctx.stats.get("staleness", 0)})
        return value

    def evaluate(self, step: int) -> torch.nn.Module:
        """Collective: every worker joins; rank 0 evaluates and logs. Not training time:
        the clock stops once every worker has finished its step."""
        self.t.barrier()
        when, began, wall = self.clock(), self.t.now(), time.perf_counter()
        consensus = self.replica.consensus_distance()
        model = representative(self.plan.config["run"]["representative"], self.model, self.t,
                               self.score)
        if self.rank == 0:
            accuracy, loss = self.plan.evaluate(model, self.plan.dataset, self.t.device)
            self.last_eval = (step, accuracy, loss, consensus)
            self.evals.write({"step": step, "time": when, "accuracy": accuracy, "loss": loss,
                              "consensus_distance": consensus})
            if self.target and accuracy >= self.target and self.time_to_target is None:
                self.time_to_target = when
        self.evaluated = (step, model)
        self.t.off_clock()
        self.eval_time += self.t.now() - began
        self.eval_wall += time.perf_counter() - wall
        self.evaluations += 1
        return model

    def score(self, model: torch.nn.Module, own: bool = False) -> float:
        """Loss on a fixed sample of 1024 training examples: the same for every worker
        (run.representative = best), or, with `own`, this worker's (tournaments)."""
        ds = self.plan.dataset
        start = (1024 * self.rank if own else 0) % len(ds.train_x)
        x, y = ds.train_x[start:start + 1024], ds.train_y[start:start + 1024]
        sample = (x.to(self.t.device), y.to(self.t.device))
        with torch.no_grad():
            return float(self.plan.step(model, sample))

    def finish(self, wall_time: float) -> dict[str, Any] | None:
        end = self.clock()
        if self.evaluated[0] != self.steps:
            self.evaluate(self.steps)
        model = self.evaluated[1]
        # each worker's own rate up to its last step (where asynchronous strategies drain,
        # waiting for the slowest): fast workers get more done
        steps, seconds = (self.steps - 1, self.penultimate) if self.steps > 1 else (1, end)
        rate = steps * self.plan.config["data"]["batch_size"] / seconds if seconds > 0 else 0.0
        totals = torch.tensor([self.sent, self.received, rate], dtype=torch.float64,
                              device=self.t.device)
        self.t.all_reduce(totals)
        if self.rank != 0:
            return None
        torch.save(model.state_dict(), self.plan.run_dir / "model.pt")
        summary = self.summary(wall_time, end, totals.tolist())
        write_json(self.plan.run_dir / "summary.json", summary)
        return summary

    def summary(self, wall_time: float, end: float, totals: list[float]) -> dict[str, Any]:
        cfg = self.plan.config
        assert self.last_eval is not None
        return {
            "strategy": cfg["strategy"]["name"], "compressor": cfg["compression"]["name"],
            "topology": cfg["strategy"].get("topology", "complete"),
            "workers": self.world, "steps": self.steps,
            "epochs": self.steps / self.shard.steps_per_epoch,
            "global_batch": self.world * cfg["data"]["batch_size"],
            "final_accuracy": self.last_eval[1], "final_loss": self.last_eval[2],
            "target_accuracy": self.target or None, "time_to_target": self.time_to_target,
            "wall_time": wall_time, "simulated_time": end if self.plan.simulated else None,
            "eval_time": self.eval_wall, "evaluations": self.evaluations,
            "samples_per_second": totals[2],
            "bytes_sent_total": int(totals[0]), "bytes_received_total": int(totals[1]),
            "consensus_distance": self.last_eval[3], "representative": cfg["run"]["representative"],
            "mode": "simulated" if self.plan.simulated else "real",
            "run_dir": str(self.plan.run_dir),
        }
