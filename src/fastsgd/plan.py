"""What every worker of a job shares (`Plan`, built by job.py) and the default iteration and
evaluation: a classifier trained with cross-entropy."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fastsgd.compress import Compressor
from fastsgd.data import Dataset, Shard, test_batches
from fastsgd.observe import Observer
from fastsgd.strategies import Strategy

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
    observer: Observer | None = None  # the simulator's free evaluations
    resume: bool = False  # continue from the newest checkpoint in run_dir
    fresh_if_none: bool = False  # resume: start afresh if run_dir holds no checkpoint

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

    def score(self, model: torch.nn.Module, device: torch.device,
              rank: int | None = None) -> float:
        """Loss on a fixed sample of 1024 training examples: the same for every worker
        (run.representative = best), or, with `rank`, that worker's own (tournaments)."""
        ds = self.dataset
        start = (1024 * rank if rank is not None else 0) % len(ds.train_x)
        x, y = ds.train_x[start:start + 1024], ds.train_y[start:start + 1024]
        with torch.no_grad():
            return float(self.step(model, (x.to(device), y.to(device))))
