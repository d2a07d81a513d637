"""The text report a run prints at its end (read from the run-directory contract only)."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean

from fastsgd.config.schema import read_toml
from fastsgd.records.metrics import PHASES, read_jsonl
from fastsgd.report.runs import describe, target_of, tokens_trained
from fastsgd.workloads.kinds import LOSS_KINDS, REGRESSION


def phase_breakdown(metrics: list[dict]) -> dict[str, float]:
    """Seconds per step of each phase, the mean over all workers and logged steps (the
    first step, which pays one-time costs, is left out when there are others). The mean,
    not the median: a strategy that communicates every k-th step (localsgd, diloco) pays
    for it in those steps, which a median would leave out."""
    rows = [m for m in metrics if m["step"] > 1] or metrics
    return {p: fmean(m[p] for m in rows) for p in PHASES} if rows else {}


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def human_count(n: float) -> str:
    """614k, 2.46M: a count to three significant digits."""
    for unit in ("", "k", "M", "G"):
        if abs(n) < 999.5:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}T" if abs(n) < 999.5 else f"{n:,.0f}T"


def epochs(value: float) -> str:
    """Epochs to two decimals, or, under 0.1 (a language model's pass over a large corpus,
    0.0004), to two significant digits, where two decimals would read 0.00."""
    return f"{value:.2g}" if 0 < abs(value) < 0.1 else f"{value:.2f}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _shown(value: float | None, form: str) -> str:
    """A number of summary.json, or n/a for its null (a NaN: a diverged model's loss)."""
    return "n/a" if value is None else form.format(value)


def _evaluation_line(s: dict) -> list[str]:
    if s.get("eval_time") is None:  # a run directory from before evaluation was timed
        return []
    return [f"evaluation     {s['eval_time']:.1f} s wall, "
            f"{plural(s['evaluations'], 'evaluation')} (not counted in training time)"]


def _to_target(s: dict) -> str:
    """", time to loss 2.00: 3.1 s" (or to 88%, or "not reached"); "" without a target."""
    target = target_of(s)
    if target is None:
        return ""
    got = f"{s['time_to_target']:.1f} s" if s["time_to_target"] is not None else "not reached"
    return f", time to {describe(target)}: {got}"


def _quality(s: dict) -> str:
    """The final evaluation: a classifier's test accuracy, or a language model's
    validation loss first (its accuracy is the share of next tokens guessed right)."""
    accuracy = _shown(s["final_accuracy"], "{:.2%}")
    if s.get("data_kind") == REGRESSION:
        return f"validation     loss {_shown(s['final_loss'], '{:.4g}')} (mean squared error)"
    if _language(s):
        return f"validation     {_loss(s)}; next-token accuracy {accuracy}"
    return f"test accuracy  {accuracy}   ({_loss(s)})"


def _language(s: dict) -> bool:
    return s.get("data_kind") in LOSS_KINDS or (target_of(s) or ("",))[0] == "loss"


def _loss(s: dict) -> str:
    """The final loss, with its perplexity (a language model's, or a loss target's) and bits
    per byte where the summary has them."""
    parts = [f"loss {_shown(s['final_loss'], '{:.4f}')}"]
    if _language(s) and s.get("final_perplexity") is not None:
        parts.append(f"perplexity {s['final_perplexity']:.4g}")
    if s.get("final_bits_per_byte") is not None:
        parts.append(f"{s['final_bits_per_byte']:.3f} bits per byte")
    return ", ".join(parts)


def text_report(run_dir: str | Path) -> str:
    run_dir = Path(run_dir)
    s = json.loads((run_dir / "summary.json").read_text())
    simulated = s.get("simulated_time")  # a summary may predate it: its wall time, then
    clock, kind = (simulated, "simulated") if simulated is not None else (s["wall_time"], "wall")
    config = read_toml(run_dir / "config.toml") if (run_dir / "config.toml").is_file() else {}
    tokens = tokens_trained(s, config)
    lines = [
        f"strategy {s['strategy']} | compressor {s['compressor']} | "
        f"{plural(s['workers'], 'worker')} | {plural(s['steps'], 'step')} "
        f"({epochs(s['epochs'])} epochs, "
        + (f"{human_count(tokens)} tokens, " if tokens is not None else "")
        + f"global batch {s['global_batch']})",
        _quality(s),
        f"training time  {clock:.1f} s {kind}{_to_target(s)}",
        *_evaluation_line(s),
        f"bytes sent     {human_bytes(s['bytes_sent_total'])} by all workers",
        f"consensus      {_shown(s['consensus_distance'], '{:.3g}')} (mean squared distance "
        "to the average)",
    ]
    metrics_path = run_dir / "metrics.jsonl"
    if metrics_path.exists():
        phases = phase_breakdown(read_jsonl(metrics_path))
        if phases:
            lines.append("per step (ms)  " + "  ".join(f"{p} {v * 1e3:.2f}"
                                                       for p, v in phases.items()))
    lines.append(f"run directory  {run_dir}")
    return "\n".join(lines)
