"""One row per run with the seeds' metrics (000 §3.2.5, 004): final accuracy, time and
epochs to target, throughput, bytes, communication overhead, the per-iteration breakdown
and scaling efficiency against the 1-worker run of the same job, and a language model's
tokens; as CSV, and as Markdown (markdown.py, whose functions are here too)."""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import statistics
from dataclasses import replace
from typing import Any

from fastsgd.loop.profiling import KEYS as PROFILED
from fastsgd.records.metrics import PHASES
from fastsgd.report.markdown import markdown_columns, seed_columns, to_markdown
from fastsgd.report.runs import RunData, describe, reached
from fastsgd.report.text import phase_breakdown

__all__ = ["COLUMNS", "MLPERF", "SEED_COLUMNS", "epochs_to_target", "job_key",
           "markdown_columns", "mlperf_score", "over_seeds", "rows", "scaling_efficiency",
           "seed_columns", "to_csv", "to_markdown"]

COLUMNS = ("run", "strategy", "codec", "workers", "steps", "tokens", "context", "clock",
           "final_accuracy", "final_loss", "final_perplexity", "bits_per_byte", "target_metric",
           "target_value", "target_accuracy", "target_loss", "time_to_target_s",
           "wall_to_target_s", "epochs_to_target", "training_time_s", "wall_time_s",
           "samples_per_s", "bytes_sent", "bytes_per_step", "comm_overhead",
           *(f"{p}_ms" for p in PHASES), "consensus_distance", "scaling_efficiency", "path")


def rows(runs: list[RunData]) -> list[dict[str, Any]]:
    out = [_row(r) for r in runs]
    for row, run, eff in zip(out, runs, scaling_efficiency(runs)):
        row["scaling_efficiency"] = eff
        # which curve of the scaling plot: the same job at other worker counts and seeds
        row["series"] = _without(run, ("run.seed=", "run.workers="))
        row["job"] = job_key(run, ("workers", "out", "seed"))
    return out


def _row(run: RunData) -> dict[str, Any]:
    s = run.summary
    phases = phase_breakdown(run.metrics)
    step_time = sum(phases.values())
    return {
        "run": run.title, "strategy": s["strategy"], "codec": s["compressor"],
        "workers": s["workers"], "steps": s["steps"], "clock": run.clock,
        "tokens": run.tokens, "context": run.context,  # a language model's, else None
        "final_accuracy": s["final_accuracy"], **_loss_columns(run), **_target_columns(run),
        "time_to_target_s": s["time_to_target"],
        "wall_to_target_s": s.get("wall_to_target"),  # runs before 2026-11-28 lack it
        "epochs_to_target": epochs_to_target(run),
        "training_time_s": run.training_time(), "wall_time_s": s["wall_time"],
        "samples_per_s": s["samples_per_second"],
        "bytes_sent": s["bytes_sent_total"], "bytes_per_step": s["bytes_sent_total"] / s["steps"],
        # the share of a step spent moving or waiting for gradients and parameters
        "comm_overhead": phases["aggregation"] / step_time if step_time else None,
        **{f"{p}_ms": v * 1e3 for p, v in phases.items()},
        "consensus_distance": s["consensus_distance"], "scaling_efficiency": None,
        "path": str(run.path),
    }


def _loss_columns(run: RunData) -> dict[str, Any]:
    """The final loss, its perplexity and (byte-level text) bits per byte; an older
    summary's perplexity from its loss."""
    s = run.summary
    loss = s.get("final_loss")
    perplexity = s.get("final_perplexity")
    if perplexity is None and loss is not None and "final_perplexity" not in s:
        perplexity = math.exp(min(loss, 700.0))
    return {"final_loss": loss, "final_perplexity": perplexity,
            "bits_per_byte": s.get("final_bits_per_byte"), "data_kind": s.get("data_kind")}


def _target_columns(run: RunData) -> dict[str, Any]:
    metric, value = run.target or (None, None)
    return {"target_metric": metric, "target_value": value,
            "target_accuracy": value if metric == "accuracy" else None,
            "target_loss": value if metric == "loss" else None,
            "target": describe(run.target)}


def epochs_to_target(run: RunData) -> float | None:
    """Epochs done by the first evaluation that reaches the target: an accuracy at or
    above it, a loss at or below it (None: not reached)."""
    target, s = run.target, run.summary
    steps = [e["step"] for e in run.evals if reached(target, e)]
    return steps[0] * s["epochs"] / s["steps"] if steps else None


def job_key(run: RunData, ignore: tuple[str, ...] = ("workers", "out")) -> str:
    """The run's clock (measured or simulated) and configuration but for the run.* keys in
    `ignore`, where it is written and, with a profiled compute model, the times each run
    measured: runs of one job match."""
    config = copy.deepcopy(run.config)
    for key in ignore:
        config.get("run", {}).pop(key, None)
    compute = config.get("compute", {})
    if compute.get("model") == "profile":
        for key in PROFILED:
            compute.pop(key, None)
    return json.dumps([run.clock, config], sort_keys=True, default=str)


def scaling_efficiency(runs: list[RunData]) -> list[float | None]:
    """Throughput at n workers / (n x throughput of the 1-worker run of the same job);
    without a 1-worker run of its own, a run is measured against one of another strategy or
    codec, the rest alike: one worker talks to no one, so its throughput is a base to scale
    against (what it learns may differ: outer optimizers and lossy codecs act on one
    worker too). None without one."""
    def key(run: RunData, any_strategy: bool) -> str:
        if not any_strategy:
            return job_key(run)
        bare = replace(run, config={k: v for k, v in run.config.items()
                                    if k not in ("strategy", "compression")})
        return job_key(bare)

    single = {key(r, loose): r.summary["samples_per_second"] for loose in (False, True)
              for r in runs if r.summary["workers"] == 1}
    out: list[float | None] = []
    for r in runs:
        base = single.get(key(r, False)) or single.get(key(r, True))
        rate = r.summary["samples_per_second"]  # null: a run in which no time passed
        out.append(rate / (r.summary["workers"] * base) if base and rate is not None else None)
    return out


MLPERF = ("Scored as MLPerf Training scores repeats: with 3 seeds or more, the fastest and "
          "the slowest are dropped and the rest averaged, a seed that did not reach the target "
          "counting as the slowest (two that did not: \"not reached\"); with 2, nothing is "
          "dropped: both are averaged, and one that did not reach it makes the cell \"not "
          "reached\".")


def mlperf_score(values: list[float | None]) -> float | None:
    """MLPerf Training's score of repeated runs, as MLPERF says: drop the fastest and the
    slowest, average the rest; a run that did not get there (None) counts as the slowest,
    and with more than one the score is None (MLPerf: an invalid result). MLPerf asks for
    5 or 10 runs; 3 or 4 are scored alike (their middle one or two), and 2 drop nothing,
    since dropping both would leave nothing: one that did not get there makes it None."""
    if sum(v is None for v in values) > 1:
        return None
    times = sorted(math.inf if v is None else v for v in values)
    if len(times) >= 3:
        times = times[1:-1]
    return None if math.inf in times else statistics.fmean(times)


SEED_COLUMNS = ("cell", "seeds", "target", "target_metric", "accuracy_mean", "accuracy_sd",
                "loss_mean", "time_to_target_s",
                "wall_to_target_s", "epochs_to_target", "samples_per_s", "clock")


def over_seeds(runs: list[RunData]) -> list[dict[str, Any]]:
    """One row per job run with several seeds: the spread of its final accuracy and its
    MLPerf-scored time and epochs to target. One run per seed (the first given): two runs
    of one seed are not two samples of it."""
    groups: dict[str, dict[Any, RunData]] = {}
    for r in runs:
        seed = r.config.get("run", {}).get("seed")
        groups.setdefault(job_key(r, ("out", "seed")), {}).setdefault(seed, r)
    out = []
    for group in (list(g.values()) for g in groups.values() if len(g) > 1):
        # null: a run whose model diverged (results.number)
        accuracy = [a for r in group if (a := r.summary["final_accuracy"]) is not None]
        loss = [v for r in group if (v := r.summary.get("final_loss")) is not None]
        metric, value = group[0].target or (None, None)
        out.append({
            "cell": _without(group[0], ("run.seed=",)), "seeds": len(group),
            "target": value, "target_metric": metric, "about": describe(group[0].target),
            "accuracy_mean": statistics.fmean(accuracy) if accuracy else None,
            "accuracy_sd": statistics.stdev(accuracy) if len(accuracy) > 1 else None,
            "loss_mean": statistics.fmean(loss) if loss else None,
            "time_to_target_s": mlperf_score([r.summary["time_to_target"] for r in group]),
            "wall_to_target_s": mlperf_score([r.summary.get("wall_to_target") for r in group]),
            "epochs_to_target": mlperf_score([epochs_to_target(r) for r in group]),
            "samples_per_s": _mean([r.summary["samples_per_second"] for r in group]),
            "clock": group[0].clock})
    return out


def _mean(values: list[float | None]) -> float | None:
    return None if None in values else statistics.fmean(values)


def _without(run: RunData, axes: tuple[str, ...]) -> str:
    """The run's label less some axes; without a label, or with nothing left of it, its
    strategy and codec (and its workers, unless they are left out)."""
    left = " ".join(p for p in run.label.split() if not p.startswith(axes))
    if left:  # a bench's cell whose only axes are those left out: named as one without
        return left
    s = run.summary
    workers = "" if "run.workers=" in axes else f" x{s['workers']}"
    return f"{s['strategy']}/{s['compressor']}{workers}"


def to_csv(table: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(table)
    return buffer.getvalue()
