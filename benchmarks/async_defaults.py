"""Asynchronous strategies at the synchronous settings: accuracy against allreduce.

    python benchmarks/async_defaults.py [--steps 1500] [--seeds 1 2] [--only ps,ssp]
        [--adapt true,false] [--jobs 2] [--json out.json]

MLP on Fashion-MNIST, 4 simulated workers, batch 32 each, SGD lr 0.05 momentum 0.9 for
every strategy (the synchronous settings, as allreduce), fixed compute of 1 ms a step (the
outcome does not depend on the machine's load). `strategy.adapt_optimizer` true is the
default (docs/strategies.md, "What each strategy does to your optimizer"); `--adapt
true,false` adds the strategies' rows without it. Prints a Markdown table of each cell's
final test accuracy (the mean over seeds, and each seed) and its gap to allreduce; a run
whose loss diverged shows "diverged".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STRATEGIES = ["ps", "ssp", "adpsgd", "sgp", "hogwild", "ltfb"]
ADAPTING = {"ps", "ssp", "hogwild", "ltfb"}  # adpsgd and sgp leave the optimizer alone
BASE = ["model.name=mlp", "run.workers=4", "data.batch_size=32", "compute.model=fixed",
        "compute.step_time=1ms", "run.eval_every=0", "optimizer.name=sgd", "optimizer.lr=0.05",
        "optimizer.momentum=0.9"]


def run(strategy: str, adapt: str, seed: int, steps: int) -> float | None:
    sets = [*BASE, f"run.steps={steps}", f"run.seed={seed}", f"strategy.name={strategy}"]
    if strategy in ADAPTING:
        sets.append(f"strategy.adapt_optimizer={adapt}")
    with tempfile.TemporaryDirectory() as out:
        args = [a for s in [*sets, f"run.out={out}/run"] for a in ("--set", s)]
        proc = subprocess.run([sys.executable, "-m", "fastsgd", "simulate", "--quiet", *args],
                              capture_output=True, text=True)
        summary = Path(out, "run", "summary.json")
        if proc.returncode != 0 or not summary.exists():  # diverged: no accuracy
            return None
        return json.loads(summary.read_text())["final_accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", default=",".join(STRATEGIES))
    ap.add_argument("--adapt", default="true", help="adapt_optimizer values, e.g. true,false")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    only = args.only.split(",")
    cells = [("allreduce", "-")] + [(s, "-") for s in only if s not in ADAPTING] + [
        (s, a) for a in args.adapt.split(",") for s in only if s in ADAPTING]
    jobs = [(cell, seed) for cell in cells for seed in args.seeds]
    load, start = os.getloadavg()[0], time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: run(*j[0], j[1], args.steps), jobs))
    table = {cell: [r for (c, _), r in zip(jobs, results) if c == cell] for cell in cells}
    print(f"MLP, Fashion-MNIST, 4 simulated workers, batch 32, SGD lr 0.05 momentum 0.9, "
          f"{args.steps} steps, seeds {args.seeds}; {time.perf_counter() - start:.0f} s, "
          f"1-minute load average {load:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print("| strategy | adapt_optimizer | accuracy (mean) | vs allreduce (points) | per seed |")
    print("| --- | --- | --- | --- | --- |")
    base = table[("allreduce", "-")]
    for (strategy, adapt), accs in table.items():
        mean = statistics.mean(accs) if None not in accs else None
        gap = (mean - statistics.mean(base)) * 100 if mean is not None and None not in base \
            else None
        seeds = ", ".join("diverged" if a is None else f"{a:.2%}" for a in accs)
        print(f"| {strategy} | {adapt} | {'diverged' if mean is None else f'{mean:.2%}'} | "
              f"{'' if gap is None else f'{gap:+.2f}'} | {seeds} |")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"strategy": s, "adapt_optimizer": a, "accuracy": r}
             for (s, a), r in table.items()], indent=1))


if __name__ == "__main__":
    main()
