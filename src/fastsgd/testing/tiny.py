"""The tiny job every conformance check trains: an MLP on the 8x8 `digits`, a few workers,
a few dozen steps, on a modeled clock (fixed compute times), so that a simulated run is a
pure function of its config and takes about a second."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastsgd.compress import CODECS
from fastsgd.config.objects import import_path
from fastsgd.config.options import Registry, validate_section
from fastsgd.job import Job
from fastsgd.loop.results import Result
from fastsgd.strategies import STRATEGIES

TINY = {"data.name": "digits", "model.name": "mlp", "data.batch_size": 16,
        "optimizer.lr": 0.05, "optimizer.momentum": 0.9, "run.eval_every": 0,
        "run.tensorboard": False, "compute.model": "fixed", "compute.step_time": "3ms",
        "compute.update": "200us"}


@dataclass(frozen=True)
class Subject:
    """What is checked: a way to make fresh instances, and the name messages use."""

    kind: str  # "strategy" or "codec"
    label: str  # the registry name, or the import path of a user's class
    make: Callable[[], Any]

    def __str__(self) -> str:
        return f"{self.kind} '{self.label}'"


def subject(kind: str, given: str | type, options: dict[str, Any]) -> Subject:
    """A built-in name, an import path `module:Class`, or a class, with its options checked
    as a config file's keys are (the class's OPTIONS, where it declares them)."""
    registry: Registry = STRATEGIES if kind == "strategy" else CODECS
    if isinstance(given, str):
        cls, label = registry.get(given), given
    elif isinstance(given, type):
        cls = given
        name = getattr(cls, "name", None)
        label = name if registry.classes.get(name) is cls else import_path(cls)
    else:
        raise TypeError(f"fastsgd.testing: give a {kind} as a name, `module:Class` or a class; "
                        f"got {given!r}")
    schema = getattr(cls, "OPTIONS", None)
    if schema is not None:  # defaults filled in, each value checked, unknown keys refused
        options = validate_section(registry.section, options, schema)
    return Subject(kind, label, lambda: cls(**options))


class TinyJob:
    """Jobs of one strategy and codec on the tiny workload, each in its own folder."""

    def __init__(self, strategy: Subject, codec: Subject, workers: int, steps: int,
                 folder: Path, **options: Any):
        self.strategy, self.codec, self.folder = strategy, codec, folder
        self.options = {**TINY, "run.workers": workers, "run.steps": steps, **options}

    @property
    def name(self) -> str:
        return f"{self.strategy} with codec '{self.codec.label}'"

    def job(self, run: str, **options: Any) -> Job:
        settings = {**self.options, **options, "run.out": str(self.folder / run)}
        return Job(strategy=self.strategy.make(), compressor=self.codec.make(),
                   options=settings, quiet=True)

    def resume(self, run: str) -> Job:
        return Job(resume=self.folder / run, strategy=self.strategy.make(),
                   compressor=self.codec.make(), quiet=True)

    def simulate(self, run: str, **options: Any) -> Result:
        return self.job(run, **options).simulate()

    def real(self, run: str, **options: Any) -> Result:
        return self.job(run, **options).run()


@contextmanager
def folder(given: str | Path | None) -> Iterator[Path]:
    """`given`, or a temporary folder removed afterwards."""
    if given is not None:
        Path(given).mkdir(parents=True, exist_ok=True)
        yield Path(given)
        return
    with tempfile.TemporaryDirectory(prefix="fastsgd-conformance-") as tmp:
        yield Path(tmp)


def parameters(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(Path(run_dir) / "model.pt", weights_only=True)


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

