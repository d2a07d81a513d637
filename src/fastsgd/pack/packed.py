"""A packed job at run time: the model rebuilt from the archive, trained without its source."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastsgd.errors import UserError
from fastsgd.frameworks.base import register
from fastsgd.pack.archive import Archive, read_archive
from fastsgd.pack.export import quiet
from fastsgd.workloads.dataset import Dataset

_LOADED: dict[tuple, tuple[Archive, Programs]] = {}  # per process: every replica shares them


class Programs:
    """The two graphs as callables; stateless, so replicas and their copies share them."""

    def __init__(self, archive: Archive) -> None:
        # (parameters, buffers, inputs, targets) and (parameters, buffers, inputs)
        self.loss = _load(archive, "loss.pt2", 4)
        self.forward = _load(archive, "forward.pt2", 3)

    def __deepcopy__(self, memo: dict) -> Programs:
        return self


def _load(archive: Archive, name: str, arguments: int) -> nn.Module:
    """Graph `name` of the archive, which takes `arguments` positional arguments."""
    try:
        with quiet():  # its own logged traceback would bury the line below
            program = torch.export.load(io.BytesIO(archive.programs[name]))
            takes = program.call_spec.in_spec.children_specs[0].num_children
            module = program.module()
    except Exception as e:  # noqa: BLE001 - a graph this torch cannot read: say which
        raise UserError(f"{archive.path}: cannot load {name} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if takes != arguments:  # the graphs in each other's place, or another archive's
        raise UserError(f"{archive.path}: {name} takes {takes} arguments where fastsgd pack "
                        f"writes one of {arguments}: it is not this archive's {name} (pack "
                        "the job again)")
    return module


class PackedModel(nn.Module):
    """The packed model, its parameters and buffers under their original names (so
    `state_dict()` and model.pt read as the source model's). Calling it is the eval-mode
    forward the archive holds (evaluation); `loss(x, y)` is the step, in training mode."""

    def __init__(self, programs: Programs, params: list[tuple[str, torch.Tensor]],
                 buffers: list[tuple[str, torch.Tensor]], frozen: set[str] = frozenset()
                 ) -> None:
        super().__init__()
        self.__dict__["programs"] = programs
        for name, tensor in params:
            register(self, name, tensor.clone(), parameter=True)
            self.get_parameter(name).requires_grad_(name not in frozen)  # as in the source
        for name, tensor in buffers:
            register(self, name, tensor.clone(), parameter=False)
        order = [n for n, _ in self.named_parameters()] + [n for n, _ in self.named_buffers()]
        if order != [n for n, _ in params] + [n for n, _ in buffers]:
            raise UserError("the archive's parameters are not in the model's order "
                            "(pack it again)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.programs.forward(list(self.parameters()), list(self.buffers()), x)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        buffers = list(self.buffers())
        loss, *updated = self.programs.loss(list(self.parameters()), buffers, x, y)
        with torch.no_grad():  # running statistics the step updated
            for buffer, value in zip(buffers, updated):
                if value is not buffer:
                    buffer.copy_(value)
        return loss


class PackedFactory:
    """`make_model` of a packed job: a fresh PackedModel at the archive's initial state.
    Built right after `torch.manual_seed(run.seed)`, as every model is (worker.py); at the
    seed it was packed with, it also sets the generator to where the source model's
    initialization left it, so that what draws from it next draws the same numbers."""

    def __init__(self, path: str | Path, versions: dict[str, str]) -> None:
        self.path, self.versions = str(Path(path).resolve()), versions
        self.archive  # noqa: B018 - loads and checks it now, in the launcher

    @property
    def archive(self) -> Archive:
        return _cached(self.path, self.versions)[0]

    def __call__(self) -> PackedModel:
        archive, programs = _cached(self.path, self.versions)
        entries = archive.manifest["tensors"]
        groups = {g: [(e["name"], archive.tensors[f"{g}/{e['name']}"])
                      for e in entries.get(g, [])] for g in ("parameters", "buffers")}
        frozen = {e["name"] for e in entries.get("parameters", [])
                  if not e.get("requires_grad", True)}
        model = PackedModel(programs, groups["parameters"], groups["buffers"], frozen)
        if torch.initial_seed() == archive.config["run"]["seed"]:
            torch.set_rng_state(archive.tensors["rng/cpu"])
        return model

    def check_data(self, dataset: Dataset, batch_size: int) -> None:
        """The data fits the archive's input signature: one line naming both otherwise."""
        _check_data(self.archive, dataset)


def _cached(path: str, versions: dict[str, str]) -> tuple[Archive, Programs]:
    """Loaded once per process and file version (an archive packed again is read again)."""
    stat = Path(path).stat() if Path(path).is_file() else None
    key = (path, stat.st_size, stat.st_mtime_ns) if stat else (path, 0, 0)
    if key not in _LOADED:
        archive = read_archive(path, versions)
        _LOADED[key] = archive, Programs(archive)
    return _LOADED[key]


def _check_data(archive: Archive, dataset: Dataset) -> None:
    sig = archive.signature
    shape, dtype = list(dataset.train_x.shape[1:]), str(dataset.train_x.dtype).split(".")[-1]
    if shape != sig["x_shape"] or dtype != sig["x_dtype"]:
        raise UserError(f"data '{dataset.name}' has inputs of shape {tuple(shape)} and dtype "
                        f"{dtype}; {archive.path.name} takes shape {tuple(sig['x_shape'])}, "
                        f"dtype {sig['x_dtype']} (set data.name / data.path, or --data)")
    y_dtype = str(dataset.train_y.dtype).split(".")[-1]
    if y_dtype != sig["y_dtype"]:
        raise UserError(f"data '{dataset.name}' has labels of dtype {y_dtype}; "
                        f"{archive.path.name} takes {sig['y_dtype']}")
    if dataset.num_classes > sig["classes"]:
        raise UserError(f"data '{dataset.name}' has {dataset.num_classes} classes; the model "
                        f"in {archive.path.name} has {sig['classes']} outputs")


def signature(dataset: Dataset, output: Any) -> dict[str, Any]:
    """What the archive takes: one sample's shape and dtype, the labels' dtype, and how many
    classes the model's output has."""
    return {"x_shape": list(dataset.train_x.shape[1:]),
            "x_dtype": str(dataset.train_x.dtype).split(".")[-1],
            "y_dtype": str(dataset.train_y.dtype).split(".")[-1],
            "classes": int(output.shape[-1]) if output.dim() else 0}
