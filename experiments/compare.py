"""Tables of a bench whose axes are a method and a deployment, one per deployment: each
method's validation loss, bits per byte and bytes against a baseline method's, its time,
time to the target and goodput.

    python3 experiments/compare.py BENCH_DIR --baseline allreduce

Goodput is the share of the cluster's compute that went into the final model: the
worker-steps trained and kept (summary.json's steps x workers, less idle_steps and
dropped_steps) times a full-speed worker's compute a step (the median forward + backward +
update of the workers without a `compute.slowdown`), over the compute the workers had in
the run's time (its seconds times the sum of 1 / slowdown over the workers). Waiting for
the network or for a straggler, and work thrown away, lower it. Simulated runs only: real
processes sharing a machine's cores have no full speed to measure against.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from fastsgd.errors import UserError
from fastsgd.report.runs import RunData, load_run
from fastsgd.report.text import human_bytes

AXES = ("method", "deployment")


def cells(bench: Path) -> dict[tuple[str, str], RunData]:
    """(method, deployment) -> the cell's run, for every finished cell, in the spec's order
    (the bench's labels.json); UserError, one line, for a folder that is not a bench or a
    bench without those two axes."""
    path = bench / "cells" / "labels.json"
    if not path.is_file():
        raise UserError(f"{bench}: not a bench directory (no cells/labels.json)")
    found = {}
    for cell, label in json.loads(path.read_text()).items():
        axes = dict(part.split("=", 1) for part in label.split() if "=" in part)
        missing = [axis for axis in AXES if axis not in axes]
        if missing:
            raise UserError(f"{bench}: its cells have no {' or '.join(missing)} axis (cell "
                            f"{cell}: {label!r}); compare.py tables a bench whose axes are "
                            "method and deployment, as experiments/language.toml's")
        if (bench / "cells" / cell / "summary.json").is_file():
            found[axes["method"], axes["deployment"]] = load_run(bench / "cells" / cell)
    return found


def seconds(run: RunData) -> float:
    s = run.summary
    return s["simulated_time"] if s.get("simulated_time") is not None else s["wall_time"]


def kept_steps(run: RunData) -> int:
    s = run.summary
    return s["steps"] * s["workers"] - s.get("idle_steps", 0) - s.get("dropped_steps", 0)


def goodput(run: RunData) -> float:
    workers = run.summary["workers"]
    slowdown = run.config.get("compute", {}).get("slowdown") or []
    factors = [float(x) for x in slowdown] + [1.0] * (workers - len(slowdown))
    full = [m["forward"] + m["backward"] + m["update"] for m in run.metrics
            if factors[m["rank"]] == 1.0]
    step = sorted(full)[len(full) // 2]
    return kept_steps(run) * step / (seconds(run) * sum(1 / f for f in factors))


def shown(value: float | None, form: str) -> str:
    """A number of summary.json, or "-" for its null: a diverged model's loss, the bits per
    byte of data that is not bytes of text (`data.name = "tokens"`)."""
    return "-" if value is None else form.format(value)


def row(method: str, run: RunData, base: RunData) -> list[str]:
    s, b = run.summary, base.summary
    loss = s["final_loss"]
    ratio = b["bytes_sent_total"] / s["bytes_sent_total"] if s["bytes_sent_total"] else math.inf
    to_target = s["time_to_target"]
    against = 100 * (loss / b["final_loss"] - 1) if loss is not None and b["final_loss"] \
        else None
    cols = [method, shown(loss, "{:.3f}"), shown(s.get("final_bits_per_byte"), "{:.2f}"),
            shown(against, "{:+.1f}%"), human_bytes(s["bytes_sent_total"]),
            f"1/{ratio:.0f}" if ratio >= 0.95 else f"{1 / ratio:.1f}x",
            f"{seconds(run):.1f}", "not reached" if to_target is None else f"{to_target:.1f}",
            f"{goodput(run):.2f}" if run.clock == "simulated" else "-"]
    return cols


def table(deployment: str, found: dict[tuple[str, str], RunData], methods: list[str],
          baseline: str) -> str:
    header = ["method", "validation loss", "bits per byte", f"vs {baseline}", "bytes sent",
              f"bytes vs {baseline}", "time (s)", "time to target (s)", "goodput"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in methods:
        run = found.get((method, deployment))
        if run is not None and (baseline, deployment) in found:
            lines.append("| " + " | ".join(row(method, run, found[baseline, deployment]))
                         + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", type=Path)
    parser.add_argument("--baseline", required=True, help="the method others are against")
    args = parser.parse_args(argv)
    try:
        found = cells(args.bench)  # in the spec's order (labels.json)
    except UserError as e:
        print(f"compare.py: error: {e}", file=sys.stderr)
        return 2
    methods = list(dict.fromkeys(m for m, _ in found))
    deployments = list(dict.fromkeys(d for _, d in found))
    out: list[Any] = []
    for deployment in deployments:
        out += [f"### {deployment}", "",
                table(deployment, found, methods, args.baseline), ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
