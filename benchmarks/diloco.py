"""DiLoCo against all-reduce: bytes on the wire and final accuracy at the same samples.

    python benchmarks/diloco.py [--epochs 3] [--period 60] [--codec fp16]
        [--real 4] [--simulated 8] [--set strategy.outer_lr=0.7 ...]
        [--variant strategy.fragments=3,strategy.overlap=5 ...]

Fashion-MNIST, the `mlp` model (784-256-256-10, 269,322 parameters), batch 32 per worker,
Adam lr 1e-3 on every worker for both strategies (all-reduce: the workers' gradients
averaged each step; diloco: Adam is the inner optimizer). diloco: `period` inner steps,
then the outer Nesterov step (outer_lr 0.7, outer_momentum 0.9: the paper's), with the
pseudo-gradient in `--codec` (fp16 by default: 2 bytes a parameter). Both run the same number
of steps on the same samples: `--epochs` of the training set. Each setting runs on `--real`
worker processes (gloo on loopback) and on `--simulated` simulated workers (the simulator's
figures do not depend on the machine: fixed compute times). A Markdown table ends the output:
accuracy, its gap to all-reduce in points, total bytes sent by all workers and all-reduce's
bytes over diloco's, with the command, the machine and its load. Each `--variant` adds a
diloco run with those options on top of the others (comma-separated KEY=VALUE pairs).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import tempfile
import time

import torch
from common import cpu_name, overrides

import fastsgd as fs

INNER = {"optimizer.name": "adam", "optimizer.lr": 1e-3, "data.batch_size": 32}
FIXED_COMPUTE = {"compute.model": "fixed", "compute.step_time": "3ms", "compute.update": "200us"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--period", type=int, default=60, help="diloco's inner steps (H)")
    p.add_argument("--codec", default="fp16", help="diloco's pseudo-gradient codec")
    p.add_argument("--real", type=int, default=4, help="worker processes (0: skip)")
    p.add_argument("--simulated", type=int, default=8, help="simulated workers (0: skip)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an option for the diloco runs, e.g. strategy.fragments=3")
    p.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE,...",
                   help="one more diloco run, with these options too")
    args = p.parse_args()
    diloco = {"strategy.name": "diloco", "strategy.period": args.period,
              "compression.name": args.codec, **overrides(args.set)}
    rows = []
    loads = [os.getloadavg()[0]]
    for mode, workers in (("real", args.real), ("simulated", args.simulated)):
        if workers <= 0:
            continue
        base = run(mode, workers, args.epochs, {"strategy.name": "allreduce"})
        rows.append(row(mode, workers, "allreduce", base, base))
        loads.append(os.getloadavg()[0])
        for extra in ["", *args.variant]:
            options = {**diloco, **overrides([kv for kv in extra.split(",") if kv])}
            ours = run(mode, workers, args.epochs, options)
            rows.append(row(mode, workers, describe(options), ours, base))
            loads.append(os.getloadavg()[0])
    print(table(rows, loads))


def run(mode: str, workers: int, epochs: float, options: dict) -> dict:
    with tempfile.TemporaryDirectory() as out:
        settings = {"run.epochs": epochs, "run.eval_every": 0, "run.out": out, **INNER,
                    **(FIXED_COMPUTE if mode == "simulated" else {}), **options}
        job = fs.Job(model="mlp", data="fashion_mnist", options=settings, quiet=True)
        start = time.perf_counter()
        summary = (job.run(workers) if mode == "real" else job.simulate(workers)).summary
        summary["seconds"] = time.perf_counter() - start
    print(f"{mode:9s} {workers} workers {options['strategy.name']:9s} "
          f"accuracy {summary['final_accuracy']:.2%} bytes {summary['bytes_sent_total']:.4g} "
          f"{summary['steps']} steps {summary['seconds']:.0f} s", flush=True)
    return summary


def row(mode: str, workers: int, name: str, s: dict, base: dict) -> list[str]:
    samples = s["steps"] * workers * INNER["data.batch_size"]
    return [f"{mode}, {workers} workers", name, f"{samples:,}", f"{s['final_accuracy']:.2%}",
            f"{100 * (s['final_accuracy'] - base['final_accuracy']):+.2f}",
            f"{s['bytes_sent_total'] / 1e6:,.1f} MB",
            f"{base['bytes_sent_total'] / s['bytes_sent_total']:.0f}x",
            f"{s['seconds']:.0f} s"]


def describe(options: dict) -> str:
    keys = {k.split(".", 1)[1]: v for k, v in options.items()
            if k.startswith("strategy.") and k != "strategy.name"}
    codec = [str(v) if k == "compression.name" else f"{k.split('.', 1)[1]} {v}"
             for k, v in options.items() if k.startswith("compression.")]
    return "diloco (" + ", ".join([*(f"{k} {v}" for k, v in keys.items()), *codec]) + ")"


def table(rows: list[list[str]], loads: list[float]) -> str:
    head = ["workers", "strategy", "samples", "test accuracy", "vs allreduce (points)",
            "bytes sent (all workers)", "allreduce bytes / these", "wall time"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    command = "python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    load = ", ".join(f"{x:.1f}" for x in loads)
    return "\n".join([
        "", f"`{command}`", "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"Python {platform.python_version()}; {datetime.date.today().isoformat()}; "
        f"1-minute load average before and after each run: {load}.", "", *lines])






if __name__ == "__main__":
    main()
