"""Watching a run: evaluations, the consensus distance and the representative model.

On real processes watching costs what it costs: every worker joins a barrier and the
collectives of representative.py, and the run's clock leaves that time out. In the simulator
it is free: a worker that finishes step k hands its replica to the `Observer` and goes on,
without waiting, sending or spending virtual time; once every worker has handed in step k,
the last one evaluates. Both keep what they saw in an `EvalLog`.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fastsgd.loop.replica import replica_tensors
from fastsgd.records.metrics import JsonLines, loss_metrics, read_jsonl
from fastsgd.strategies.params import assign

Evaluate = Callable[[torch.nn.Module], tuple[float, float]]  # -> (accuracy, loss)
Score = Callable[[torch.nn.Module], float]
METRICS = ("accuracy", "loss")


@dataclass(frozen=True)
class Target:
    """The run's target: an accuracy to reach (at or above) or a loss to get down to (at or
    below); a value of 0 is none."""

    metric: str = "accuracy"  # one of METRICS
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"a target's metric is 'accuracy' or 'loss', not {self.metric!r}")

    def __bool__(self) -> bool:
        return self.value > 0

    def reached(self, accuracy: float, loss: float) -> bool:
        """Does an evaluation of this accuracy and loss reach it? (a NaN loss never does)"""
        if not self:
            return False
        return accuracy >= self.value if self.metric == "accuracy" else loss <= self.value

    def described(self) -> dict[str, object] | None:
        """summary.json's "target": {"metric": ..., "value": ...}, or None."""
        return {"metric": self.metric, "value": self.value} if self else None


def target_of(run: dict, kind: str = "images") -> Target:
    """The [run] section's target: run.target_loss where set (> 0), else
    run.target_accuracy (0: none), which only a classifier's data ("images") has: the
    share of next tokens guessed right is no goal to train a language model to."""
    if run.get("target_loss", 0.0) > 0:
        return Target("loss", float(run["target_loss"]))
    if kind != "images":
        return Target()
    return Target("accuracy", float(run.get("target_accuracy", 0.0)))


@dataclass
class EvalLog:
    """What the evaluations found (rank 0's, or the simulator's shared one). `kind` is the
    dataset's ("text": each record also says the loss in bits per byte)."""

    path: object
    target: Target | float = field(default_factory=Target)  # a float: an accuracy
    kind: str = "images"
    last: tuple[int, float, float, float] | None = None  # step, accuracy, loss, consensus
    model: tuple[int, torch.nn.Module | None] = (0, None)  # step, representative
    time_to_target: float | None = None  # on the run's clock
    # wall seconds of the run (setup excluded, evaluations included) when that evaluation
    # ended; None where unknown (reached before a worker took over the log from the file)
    wall_to_target: float | None = None
    count: int = 0
    wall: float = 0.0  # wall seconds spent evaluating
    writer: JsonLines = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.target, Target):
            self.target = Target("accuracy", float(self.target))
        self.writer = JsonLines(self.path, flush_every=1)

    def record(self, step: int, when: float, model: torch.nn.Module, accuracy: float,
               loss: float, consensus: float, wall: float) -> None:
        self.last, self.model = (step, accuracy, loss, consensus), (step, model)
        self.writer.write({"step": step, "time": round(when, 9),  # a regression's: null
                           "accuracy": None if accuracy is None or accuracy != accuracy
                           else accuracy,
                           "loss": loss, **loss_metrics(loss, self.kind),
                           "consensus_distance": consensus})
        if self.target.reached(accuracy, loss) and self.time_to_target is None:
            self.time_to_target, self.wall_to_target = round(when, 9), round(wall, 3)

    def state(self) -> list:
        """What a checkpoint or a joining worker takes of it."""
        return [self.last, self.time_to_target, self.count, self.wall, self.wall_to_target]

    def load(self, saved: list) -> None:
        self.last, self.time_to_target, self.count, self.wall = saved[:4]
        self.wall_to_target = saved[4] if len(saved) > 4 else None  # older checkpoints

    def take_over(self) -> None:
        """What the evaluations found so far, from the file: the worker that wrote it was
        lost, and this one evaluates from now on."""
        for row in read_jsonl(self.path) if Path(str(self.path)).exists() else []:
            accuracy = math.nan if row["accuracy"] is None else row["accuracy"]
            self.last = (row["step"], accuracy, row["loss"], row["consensus_distance"])
            if self.target.reached(accuracy, row["loss"]) and self.time_to_target is None:
                self.time_to_target = row["time"]


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in replica_tensors(model)])


class _Snapshot:
    """One step's replicas, accumulated as they come: the sums of their differences to the
    first one (so identical replicas give a distance of exactly 0), the best by score,
    rank 0's, and the latest clock."""

    def __init__(self, policy: str):
        self.policy, self.count, self.when, self.wall = policy, 0, 0.0, 0.0
        self.first: torch.Tensor | None = None
        self.sum: torch.Tensor | None = None
        self.squares = 0.0
        self.like: torch.nn.Module | None = None
        self.like_rank = -1
        self.best: tuple[float, int, torch.nn.Module] | None = None
        self.held: torch.Tensor | None = None  # the strategy's own model, if it holds one

    def add(self, rank: int, model: torch.nn.Module, when: float, wall: float,
            score: Score) -> None:
        flat = _flat(model)
        if self.first is None:
            self.first, self.sum = flat, torch.zeros_like(flat)
        diff = flat - self.first
        self.sum += diff
        self.squares += float(diff.dot(diff))
        self.count += 1
        self.when, self.wall = max(self.when, when), max(self.wall, wall)
        # rank0: the lowest rank handed in (worker 0, or once it is lost the next)
        if self.like is None and self.policy in ("average", "rank0") or (
                self.policy == "rank0" and rank < self.like_rank):
            self.like, self.like_rank = copy.deepcopy(model), rank
        if self.policy == "best":
            mine = (score(model), rank)
            if self.best is None or mine < self.best[:2]:
                self.best = (*mine, copy.deepcopy(model))

    def consensus(self) -> float:
        mean = self.sum / self.count
        return max(0.0, self.squares / self.count - float(mean.dot(mean)))

    def representative(self) -> torch.nn.Module:
        if self.policy == "best":
            return self.best[2]
        model = self.like
        if self.held is not None:
            assign(replica_tensors(model), self.held)
        elif self.policy == "average" and self.count > 1:
            average, offset = self.first + self.sum / self.count, 0
            with torch.no_grad():
                for t in replica_tensors(model):
                    t.copy_(average[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
        return model


class Observer:
    """The simulator's free evaluations: `hand_in` never blocks or advances a clock."""

    def __init__(self, workers: int, policy: str, evaluate: Evaluate, log: EvalLog):
        self.workers, self.policy, self.evaluate, self.log = workers, policy, evaluate, log
        self._steps: dict[int, _Snapshot] = {}
        self._lock = threading.Lock()  # one simulated worker runs at a time; this is cheap
        self._handing_in: Callable[[int], int] = lambda step: self.workers

    def hand_in(self, step: int, rank: int, model: torch.nn.Module, when: float, wall: float,
                score: Score, held: torch.Tensor | None = None) -> None:
        """Worker `rank`'s replica after `step`; `held`: the model its strategy holds, which
        is scored in place of the average (evaluate.py, held_model)."""
        with self._lock:
            snapshot = self._steps.setdefault(step, _Snapshot(self.policy))
            snapshot.add(rank, model, when, wall, score)
            if held is not None and snapshot.held is None:  # the same on every worker
                snapshot.held = held.detach().clone()
        self._evaluate_complete()

    def crashed(self, handing_in: Callable[[int], int]) -> None:
        """Workers crashed or new ones took their places (the simulator's faults): a step is
        complete once `handing_in(step)` workers handed in their models (a worker that left
        at step k hands in at most step k)."""
        self._handing_in = handing_in
        self._evaluate_complete()

    def _evaluate_complete(self) -> None:
        for step in sorted(self._steps):
            expected = self._handing_in(step)
            if self._steps[step].count >= expected:
                self._evaluate(step, self._steps.pop(step))

    def _evaluate(self, step: int, snapshot: _Snapshot) -> None:
        began = time.perf_counter()
        chosen = snapshot.representative()
        accuracy, loss = self.evaluate(chosen)
        self.log.count += 1
        spent = time.perf_counter() - began
        self.log.record(step, snapshot.when, chosen, accuracy, loss, snapshot.consensus(),
                        snapshot.wall + spent)
        self.log.wall += spent
