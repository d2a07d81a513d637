"""What several benchmarks share: one `fastsgd simulate` run in a subprocess, the machine's
CPU name, and `key=value` overrides."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fastsgd.records.rundir import cpu_name

__all__ = ["cpu_name", "overrides", "simulate"]  # cpu_name: for the figures' captions


def simulate(sets: list[str], evals: bool = False) -> dict[str, Any] | None:
    """The run's summary (with its evaluations under "evals" if asked), or None if it
    failed (a diverged run ends with an error)."""
    with tempfile.TemporaryDirectory() as out:
        args = [a for s in [*sets, f"run.out={out}/run"] for a in ("--set", s)]
        proc = subprocess.run([sys.executable, "-m", "fastsgd", "simulate", "--quiet", *args],
                              capture_output=True, text=True)
        run = Path(out, "run")
        if proc.returncode != 0 or not (run / "summary.json").exists():
            return None
        summary = json.loads((run / "summary.json").read_text())
        if evals:
            lines = (run / "eval.jsonl").read_text().splitlines()
            summary["evals"] = [json.loads(line) for line in lines]
        return summary


def overrides(pairs: list[str]) -> dict:
    """`key=value` pairs, each value read as JSON where it parses (numbers, booleans)."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
