"""Run directories as a report reads them: summary, resolved configuration, per-step metrics
and evaluations, and the series the plots draw (accuracy, bytes and consensus over time)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastsgd.config.schema import read_toml
from fastsgd.errors import UserError
from fastsgd.records.metrics import PHASES
from fastsgd.report.clocks import clock_of
from fastsgd.workloads.kinds import LANGUAGE

NEEDED = ("summary.json", "metrics.jsonl", "eval.jsonl")
# what the report reads of summary.json (wall_to_target, target_accuracy: runs before
# 2026-11-28 lack them; target, target_loss, final_perplexity, final_bits_per_byte,
# data_kind: runs before loss targets (2026-12) lack them, and their target is
# target_accuracy's; a summary without mode or simulated_time is on the clock its
# environment.json's backend says, else an unknown one: clocks.clock_of)
SUMMARY = ("strategy", "compressor", "workers", "steps", "epochs", "final_accuracy",
           "time_to_target", "wall_time", "samples_per_second", "bytes_sent_total",
           "consensus_distance")
NUMBERS = (*SUMMARY[2:], "simulated_time")  # numbers or null where the summary has them
LABELS = "labels.json"  # {folder name: label}, beside a bench's cell folders
DEPTH = 3  # how far below a bench directory run directories are looked for
# what the tables and plots read of each line of metrics.jsonl and eval.jsonl
RECORDS = {"metrics.jsonl": ("step", "bytes_sent", *PHASES),
           "eval.jsonl": ("step", "time")}  # and an accuracy or (a regression's) a loss


@dataclass
class RunData:
    path: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    environment: dict[str, Any]
    label: str = ""  # a bench cell's values on its axes (LABELS beside its folder)

    @property
    def title(self) -> str:
        """What the tables call it: its axis values in a bench, else its folder's name."""
        return self.label or self.path.name

    @property
    def name(self) -> str:
        s = self.summary
        return f"{s['strategy']}/{s['compressor']} x{s['workers']} ({self.title})"

    @property
    def clock(self) -> str:
        """What its times count: "simulated", "measured" (wall) or "unknown" seconds."""
        return clock_of(self.summary, self.environment)

    @property
    def target(self) -> tuple[str, float] | None:
        """(metric, value) of the run's target ("accuracy" or "loss"), or None."""
        return target_of(self.summary)

    @property
    def context(self) -> int | None:
        """A language model's tokens per validation window (model.context), else None."""
        return context_of(self.summary, self.config)

    @property
    def tokens(self) -> int | None:
        """The tokens a language model trained on (tokens_trained), else None."""
        return tokens_trained(self.summary, self.config)

    def training_time(self) -> float | None:
        """Seconds of training on the run's clock (None: a simulation whose summary does not
        hold its simulated time)."""
        s = self.summary
        if s.get("simulated_time") is not None:
            return s["simulated_time"]
        return None if self.clock == "simulated" else s["wall_time"]

    def bytes_until(self) -> list[tuple[int, float]]:
        """(step, bytes sent by all workers up to it), from the logged steps. With
        run.log_every = k only every k-th step is logged: the curve is then scaled to end
        at the run's total (summary.json), exact at the end, estimated on the way."""
        per_step: dict[int, float] = {}
        for m in self.metrics:
            per_step[m["step"]] = per_step.get(m["step"], 0.0) + m["bytes_sent"]
        total, out = 0.0, []
        for step in sorted(per_step):
            total += per_step[step]
            out.append((step, total))
        if self.config.get("run", {}).get("log_every", 1) > 1 and total > 0:
            scale = self.summary["bytes_sent_total"] / total
            out = [(step, sent * scale) for step, sent in out]
        return out

    def accuracy_by_bytes(self) -> list[tuple[float, float]]:
        return self.by_bytes("accuracy")

    def by_bytes(self, metric: str) -> list[tuple[float, float]]:
        """(bytes sent by all workers until each evaluation, its `metric`), where finite."""
        sent = self.bytes_until()
        points = []
        for e in self.evals:
            value = e.get(metric)
            if not isinstance(value, int | float) or not math.isfinite(value):
                continue
            before = [b for s, b in sent if s <= e["step"]]
            points.append((before[-1] if before else 0.0, float(value)))
        return points


def target_of(summary: dict[str, Any]) -> tuple[str, float] | None:
    """(metric, value) of a summary's target, or None; an older summary's is its
    target_accuracy."""
    target = summary.get("target")
    if isinstance(target, dict) and target.get("value"):
        return str(target["metric"]), float(target["value"])
    if summary.get("target_loss"):
        return "loss", float(summary["target_loss"])
    return ("accuracy", float(summary["target_accuracy"])) if summary.get(
        "target_accuracy") else None


def context_of(summary: dict[str, Any], config: dict[str, Any]) -> int | None:
    """model.context of a run on text or tokens (the length of its training and validation
    windows: the targets each holds); None for other data, or where config.toml lacks it."""
    context = config.get("model", {}).get("context")
    if summary.get("data_kind") not in LANGUAGE or not _number(context):
        return None
    return int(context)


def tokens_trained(summary: dict[str, Any], config: dict[str, Any]) -> int | None:
    """The tokens a run on text or tokens trained on: steps x global batch (which holds
    run.accumulate) x model.context, the worker-steps an asynchronous or shrunk run left
    idle included; None for other data, or a run directory that lacks one of them."""
    context, batch = context_of(summary, config), summary.get("global_batch")
    if context is None or not _number(batch) or not _number(summary.get("steps")):
        return None
    return int(summary["steps"]) * int(batch) * context


def reached(target: tuple[str, float] | None, evaluation: dict[str, Any]) -> bool:
    """Does a line of eval.jsonl reach the target? (a NaN or absent loss never does)"""
    if target is None:
        return False
    metric, value = target
    got = evaluation.get(metric)
    if not _number(got):
        return False
    return got >= value if metric == "accuracy" else got <= value


def describe(target: tuple[str, float] | None) -> str:
    """"loss 2.00" or "88%": what "time to ..." names."""
    if target is None:
        return ""
    metric, value = target
    return f"loss {value:.2f}" if metric == "loss" else f"{value:.0%}"


def load_run(path: str | Path) -> RunData:
    """One finished run directory, or one line naming what it lacks or which file is
    damaged."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: no such run directory")
    missing = [name for name in NEEDED if not (path / name).is_file()]
    if missing:
        raise UserError(f"{path}: not a finished run directory (no {', '.join(missing)})")
    summary = _read(path / "summary.json", _json)
    absent = [key for key in SUMMARY if key not in summary]
    if absent:
        raise UserError(f"{path / 'summary.json'}: not a fastsgd run summary (no "
                        f"{', '.join(absent)})")
    wrong = [key for key in NUMBERS if summary.get(key) is not None
             and (not isinstance(summary[key], (int, float)) or isinstance(summary[key], bool))]
    if wrong:
        raise UserError(f"{path / 'summary.json'}: a damaged file ({wrong[0]} is "
                        f"{summary[wrong[0]]!r}, not a number)")
    metrics, evals = (_records(path / name) for name in RECORDS)
    environment = _read(path / "environment.json", _json)
    label = _read(path.parent / LABELS, _json).get(path.name, "")
    if not metrics:
        raise UserError(f"{path}: metrics.jsonl holds no steps")
    config = read_toml(path / "config.toml") if (path / "config.toml").is_file() else {}
    return RunData(path, summary, config, metrics, evals, environment, label)


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    try:
        return read(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: a damaged file ({e})") from None


def _records(path: Path) -> list[dict[str, Any]]:
    """The lines of a JSON Lines file of the run directory, each an object with the numbers
    the report reads (RECORDS), or one line naming the file and the first line that is not."""
    records = []
    for number, line in enumerate(_read(path, lambda p: p.read_text().splitlines()), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            at = " " if e.msg.endswith(" at") else ", at "  # "Unterminated string starting at"
            raise UserError(f"{path}: line {number} is damaged ({e.msg}{at}column "
                            f"{e.colno})") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}: line {number} is not a fastsgd record (a JSON "
                            f"{type(record).__name__}, not an object)")
        absent = [key for key in RECORDS[path.name] if not _number(record.get(key))]
        if path.name == "eval.jsonl" and not _scored(record):
            absent.append("accuracy")
        if absent:
            raise UserError(f"{path}: line {number} is not a fastsgd record (no number for "
                            f"{', '.join(absent)})")
        records.append(record)
    return records


def _scored(evaluation: dict[str, Any]) -> bool:
    """An accuracy, or null (a regression's) beside a loss."""
    accuracy = evaluation.get("accuracy", False)
    return _number(accuracy) or accuracy is None and _number(evaluation.get("loss"))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json(path: Path) -> dict[str, Any]:
    """A JSON object, {} if there is no such file."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: a damaged file (a JSON {type(data).__name__}, not an object)")
    return data


def _natural(path: Path) -> list:
    """allreduce-4 before allreduce-16."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_runs(paths: list[str | Path]) -> list[RunData]:
    """Run directories, given as themselves or as a folder holding them (a bench
    directory), in the order given and then by name."""
    runs: list[RunData] = []
    for given in map(Path, paths):
        if not given.is_dir():
            what = "a file, not a run or bench directory" if given.exists() else \
                "no such run or bench directory"
            raise UserError(f"{given}: {what}")
        if (given / "summary.json").exists() or (given / "metrics.jsonl").exists():
            runs.append(load_run(given))
            continue
        found = sorted({p.parent for depth in range(1, DEPTH + 1)
                        for p in given.glob("/".join(["*"] * depth) + "/summary.json")},
                       key=_natural)
        if not found:
            raise UserError(f"{given}: no run directory in it (none holds a summary.json)")
        runs.extend(load_run(p) for p in found)
    once = {r.path.resolve(): r for r in reversed(runs)}  # given twice: r1 and ./r1/, or
    return [r for r in runs if once[r.path.resolve()] is r]  # alone and in its bench
