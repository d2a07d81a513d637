"""What every worker of a job shares (`Plan`, built by fastsgd.job) and the default iteration and
evaluation: a classifier trained with cross-entropy.

Watching a run must not change it (docs/simulator.md, "Observation is free"): the user's
evaluate and the scoring of replicas (run.representative = best, tournaments) run
`untouched`, and what evaluate returns is checked in one place (`Evaluation`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fastsgd.compress import Compressor
from fastsgd.config.objects import described, import_path
from fastsgd.errors import UserError
from fastsgd.loop.observe import Observer
from fastsgd.strategies import Strategy
from fastsgd.workloads.data import Shard, test_batches
from fastsgd.workloads.dataset import Dataset

Batch = tuple[torch.Tensor, torch.Tensor]
DEFAULT_EPOCHS = 8.0  # run.epochs = 0, for a dataset without default_steps
StepFn = Callable[[torch.nn.Module, Batch], torch.Tensor]
EvalFn = Callable[[torch.nn.Module, Dataset, torch.device], tuple[float, float]]


def as_input(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Floating-point `x` in the dtype of the model's parameters (float64, bfloat16...);
    anything else (token ids) as it is."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if dtype is None or not x.is_floating_point() or x.dtype == dtype:
        return x
    return x.to(dtype)


def cross_entropy_step(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The default iteration: classification with cross-entropy."""
    x, y = batch
    logits = model(as_input(model, x))
    if not isinstance(logits, torch.Tensor):
        raise UserError(_not_logits("step", logits))
    return F.cross_entropy(logits, y)


def _not_logits(which: str, out: Any) -> str:
    what = (f"a tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor)
            else described(out))
    return (f"the default {which} needs a model returning logits of shape (N, classes); "
            f"this one returned {what}: pass {which}=")


@torch.no_grad()
def evaluate_classifier(model: torch.nn.Module, dataset: Dataset,
                        device: torch.device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on the test split."""
    correct, loss, count = 0, 0.0, 0
    with kept_modes(model):
        model.eval()
        for x, y in test_batches(dataset.test_x, dataset.test_y):
            logits = model(as_input(model, x.to(device)))
            y = y.to(device)
            if not (isinstance(logits, torch.Tensor) and logits.ndim == 2
                    and len(logits) == len(y)):
                raise UserError(_not_logits("evaluate", logits))
            if logits.dtype in (torch.float16, torch.bfloat16):  # a 16-bit sum loses digits
                logits = logits.float()
            correct += int((logits.argmax(1) == y).sum())
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            count += len(y)
    return correct / count, loss / count


@contextmanager
def kept_modes(model: torch.nn.Module) -> Iterator[None]:
    """Every module's training mode back as it was (model.train(was) would also switch
    submodules the user keeps in the other mode, such as a frozen BatchNorm)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextmanager
def untouched(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """What runs inside leaves training as it found it: the modules' training modes, the
    buffers (BatchNorm's running statistics) and the random generators that training
    draws from (the CPU's, and `device`'s). Parameters are not copied (a model's size):
    scoring runs without gradients, and an evaluate has no optimizer to step."""
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    try:
        with kept_modes(model), torch.random.fork_rng(
                devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        with torch.no_grad():
            for name, saved in buffers.items():
                model.get_buffer(name).copy_(saved)


class Evaluation:
    """The user's evaluate (`fn`) as every worker calls it: `untouched` (on real processes
    with run.representative = rank0 it sees the live replica), and its result checked
    here, the one place, so that a wrong one fails in one line, not as a TypeError or a
    file that is not JSON after training. A NaN (a diverged model's loss) is kept: it goes
    to eval.jsonl as metrics.jsonl's losses do, and summary.json says null (results.py)."""

    def __init__(self, fn: EvalFn):
        self.fn = fn

    def __call__(self, model: torch.nn.Module, dataset: Dataset,
                 device: torch.device) -> tuple[float, float]:
        with untouched(model, device):
            result = self.fn(model, dataset, device)
        return checked(result, self.fn)


def checked(result: Any, fn: EvalFn) -> tuple[float, float]:
    """(accuracy, loss) as two floats (0-d tensors and numpy scalars convert), or
    UserError naming `fn`."""
    if isinstance(result, (tuple, list)) and len(result) == 2 and not any(
            isinstance(v, (str, bytes)) for v in result):
        try:
            return float(result[0]), float(result[1])
        except (TypeError, ValueError, RuntimeError):  # not a number, a tensor of several
            pass
    raise UserError(f"model.evaluate ({import_path(fn)}) returned {_described(result)}; it "
                    "must return (accuracy, loss), two numbers")


def _described(result: Any) -> str:
    if result is None:
        return "None"
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            return f"a {type(result).__name__} of {len(result)} values"
        return "(" + ", ".join(_kind(v) for v in result) + ")"
    return described(result)


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return "None" if value is None else described(value)


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

    def __post_init__(self) -> None:
        if not isinstance(self.evaluate, Evaluation):  # the simulated and the real paths
            self.evaluate = Evaluation(self.evaluate)

    def total_steps(self, world_size: int) -> int:
        run = self.config["run"]
        if run["steps"]:
            return run["steps"]
        if not run["epochs"] and self.dataset.default_steps:
            return self.dataset.default_steps
        epochs = run["epochs"] or DEFAULT_EPOCHS
        return max(1, math.ceil(epochs * self.shard(0, world_size).steps_per_epoch))

    def shard(self, rank: int, world_size: int) -> Shard:
        """Worker `rank`'s slice of every global batch: run.accumulate micro-batches of
        data.batch_size each."""
        ds, config = self.dataset, self.config
        batch = config["data"]["batch_size"] * config["run"]["accumulate"]
        return Shard(ds.train_x, ds.train_y, batch, rank, world_size, config["run"]["seed"],
                     tokens=ds.train_tokens)

    def score(self, model: torch.nn.Module, device: torch.device,
              rank: int | None = None) -> float:
        """Loss on a fixed sample of 1024 training examples: the same for every worker
        (run.representative = best), or, with `rank`, that worker's own (tournaments).
        A measurement, not a step: `untouched`, and in eval mode, the mode the chosen model
        is evaluated and used in (BatchNorm by its running statistics; no dropout draws,
        whose noise would pick the luckiest replica, not the best)."""
        ds = self.dataset
        start = (1024 * rank if rank is not None else 0) % len(ds.train_x)
        x, y = ds.train_x[start:start + 1024], ds.train_y[start:start + 1024]
        with untouched(model, device), torch.no_grad():
            model.eval()
            return float(self.step(model, (x.to(device), y.to(device))))
