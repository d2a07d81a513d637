"""`fastsgd pack`: a job as one archive that trains without the user's Python source.

The archive (archive.py) holds the step and the model as graphs of ATen operations
(export.py), the initial parameters, the resolved configuration and the input signature.
`fastsgd run job.fsj`, `fastsgd simulate job.fsj` and torchrun train it on a machine that
has fastsgd and torch and nothing of the user's (packed.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fastsgd.config import VERSION
from fastsgd.config import schema as cfg
from fastsgd.config.objects import is_import_path
from fastsgd.errors import ConfigError, UserError
from fastsgd.frameworks.base import NO_DDP
from fastsgd.pack.archive import Archive, read_archive, write_archive
from fastsgd.pack.export import StepFn, export_programs
from fastsgd.pack.packed import PackedFactory, PackedModel, signature
from fastsgd.pack.validate import check_program
from fastsgd.strategies import CHOICES
from fastsgd.workloads.dataset import Dataset
from fastsgd.workloads.kinds import LANGUAGE

__all__ = ["Archive", "PackedFactory", "PackedModel", "archive_config", "check_config", "pack",
           "read_archive", "versions"]

PACKED = "packed"  # model.name and model.step of a packed job
ARCHIVE_SUFFIX = ".fsj"  # the name of a job archive ends in it (fastsgd run reads it as one)
BUILTIN_NAMES = {"optimizer.name": ("sgd", "adam"), "model.evaluate": ("accuracy",)}


def versions() -> dict[str, str]:
    return {"fastsgd": VERSION, "torch": torch.__version__}


def pack(config: dict[str, Any], make_model: Callable[[], torch.nn.Module], step: StepFn,
         dataset: Dataset, out: str | Path) -> Path:
    """Write the job to `out` (an .fsj archive) and return its path. The model is built as
    a worker builds it (torch.manual_seed(run.seed), then make_model()), so the archive's
    initial parameters are the ones the source job starts from."""
    path = archive_path(out, config)
    packed = packed_config(config)
    if isinstance(make_model, PackedFactory):  # a packed job's graphs, with this config
        _repack(read_archive(make_model.path, versions()), packed, path)
        return path
    torch.manual_seed(config["run"]["seed"])
    model = make_model()
    rng = torch.get_rng_state()
    n = min(config["data"]["batch_size"], len(dataset.train_y))
    x, y = dataset.train_x[:n], dataset.train_y[:n]
    inputs = x[:, :-1].long() if dataset.kind in LANGUAGE else x  # what the model gets
    loss, forward = export_programs(model, step, x, y, inputs)
    for key, program in (("model.step", loss), ("model.name", forward)):
        why = check_program(program)  # what the loader would refuse, refused here
        if why:
            raise UserError(f"{key}: its graph holds what fastsgd's loader refuses: {why}")
    with torch.no_grad():
        was_training = model.training
        output = model.eval()(inputs[:1])
        model.train(was_training)
    tensors = {"parameters": [(k, p) for k, p in model.named_parameters()],
               "buffers": [(k, b) for k, b in model.named_buffers()],
               "rng": [("cpu", rng)]}
    write_archive(path, packed, signature(dataset, output),
                  {"loss.pt2": loss, "forward.pt2": forward}, tensors, versions())
    return path


def _repack(archive: Archive, config: dict[str, Any], path: Path) -> None:
    """`archive`'s graphs and initial tensors again, under `config`: a packed job packed
    (its source is not here to export again)."""
    groups = {group: [(item["name"], archive.tensors[f"{group}/{item['name']}"]
                       .requires_grad_(bool(item["requires_grad"])))
                      for item in items]
              for group, items in archive.manifest["tensors"].items()}
    write_archive(path, config, archive.signature, dict(archive.programs), groups, versions())


def archive_path(out: str | Path, config: dict[str, Any]) -> Path:
    """`out` if an archive may be written there: its name ends in .fsj, the one suffix
    `fastsgd run` reads as an archive (a script or config of that name would be overwritten),
    and it is not the archive the job's model comes from (model.packed)."""
    path = Path(out)
    if path.suffix != ARCHIVE_SUFFIX:
        raise UserError(f"{out}: a job archive's name ends in {ARCHIVE_SUFFIX}, which fastsgd "
                        f"run reads as one; write e.g. {_suggested(path)}")
    source = config["model"]["packed"]
    if source and path.exists() and Path(source).exists() and path.samefile(source):
        raise UserError(f"{out} is model.packed, the archive this job's model comes from; "
                        "write the new one to another file")
    return path


def _suggested(path: Path) -> Path:
    if path.is_dir() or not path.name:
        return path / f"job{ARCHIVE_SUFFIX}"
    stem = path.stem if path.stem and not path.stem.startswith(".") else "job"
    return path.with_name(stem + ARCHIVE_SUFFIX)


def packed_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config an archive carries: nothing that names the user's code, no run folder."""
    check_config(config)
    out = copy.deepcopy(config)
    out["model"] = {**out["model"], "name": PACKED, "step": PACKED, "evaluate": "accuracy",
                    "packed": ""}
    out["run"]["out"] = ""
    return out


def check_config(config: dict[str, Any]) -> None:
    """Refuse what a packed job cannot run: the user's own code named in the config (also
    on reading an archive, whose config may have been written by anyone), and DDP."""
    if config["strategy"]["name"] == "ddp":
        raise UserError(NO_DDP)
    for key, allowed in BUILTIN_NAMES.items():
        section, name = key.split(".")
        value = config[section][name]
        if value not in allowed and not _torch_path(value):
            raise UserError(f"{key} = '{value}' is the user's Python code, which a job "
                            f"archive does not carry; use {' or '.join(allowed)}"
                            + (" or a torch.optim class" if section == "optimizer" else ""))
    for key in ("strategy.name", "compression.name", "data.name"):
        section, name = key.split(".")
        value = config[section][name]
        if is_import_path(value) and not _torch_path(value):
            raise UserError(f"{key} = '{value}' is the user's Python code, which a job "
                            "archive does not carry; use a built-in one (fastsgd keys)")


def _torch_path(value: str) -> bool:
    return value.startswith("torch.") and ":" in value


def archive_config(path: str | Path, options: dict[str, Any]) -> tuple[dict, dict[str, Any]]:
    """The config a job archive carries (checked: whole, unchanged, this torch, naming no
    code of anyone's), and the options with model.packed, the archive."""
    if "model.packed" in options:  # the archive is the model: another would be ignored
        raise ConfigError(f"model.packed = {options['model.packed']!r}: {path} is a job "
                          "archive, whose model is its own; leave model.packed out")
    config = read_archive(path, versions()).config
    try:
        check_config(cfg.validate(config, CHOICES))
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    return config, {**options, "model.packed": str(Path(path).resolve())}
