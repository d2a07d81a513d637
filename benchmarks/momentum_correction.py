"""Codecs at the synchronous settings: momentum SGD (and Adam) through every error-feedback codec.

    python benchmarks/momentum_correction.py [--steps 1500] [--seeds 1 2] [--only onebit,sign]
        [--optimizers sgd,adam] [--correction auto,off] [--jobs 2] [--json out.json]

MLP on Fashion-MNIST, 4 simulated workers, batch 32 each, `allreduce`, the demo's optimizer
(SGD lr 0.05, momentum 0.9) or Adam (lr 0.001), fixed compute (the outcome does not depend on
the machine). `strategy.momentum_correction` auto compresses each worker's update (on, since
both optimizers have momentum); off compresses the gradient, as before issue 11. Prints each
cell's final test accuracy (the mean over seeds, and each seed) and its gap to `none`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import simulate

CODECS = {"none": [], "onebit": [], "sign": [], "topk": [], "randomk": [], "powersgd": [],
          "qsgd": ["compression.error_feedback=true"], "dgc": []}
OPTIMIZERS = {"sgd": [], "adam": ["optimizer.name=adam", "optimizer.lr=0.001"]}
BASE = ["model.name=mlp", "run.workers=4", "data.batch_size=32", "compute.model=fixed",
        "compute.step_time=1ms", "run.eval_every=0", "strategy.name=allreduce"]


def run(codec: str, optimizer: str, correction: str, seed: int, steps: int) -> float | None:
    sets = [*BASE, f"run.steps={steps}", f"run.seed={seed}", f"compression.name={codec}",
            f"strategy.momentum_correction={correction}", *CODECS[codec], *OPTIMIZERS[optimizer]]
    summary = simulate(sets)
    return None if summary is None else summary["final_accuracy"]  # None: diverged


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", default=",".join(CODECS))
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--correction", default="auto")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    codecs = ["none", *[c for c in args.only.split(",") if c != "none"]]
    cells = [(c, o, m) for o in args.optimizers.split(",") for c in codecs
             for m in (["auto"] if c == "none" else args.correction.split(","))]
    jobs = [(cell, seed) for cell in cells for seed in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: run(*j[0], j[1], args.steps), jobs))
    table = {cell: [r for (c, _), r in zip(jobs, results) if c == cell] for cell in cells}
    print(f"MLP, Fashion-MNIST, 4 simulated workers, batch 32, {args.steps} steps, "
          f"seeds {args.seeds}\n")
    print("| optimizer | codec | correction | accuracy (mean) | vs none | per seed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (codec, opt, mode), accs in table.items():
        mean = statistics.mean(accs) if None not in accs else None
        base = table[("none", opt, "auto")]
        gap = (mean - statistics.mean(base)) * 100 if mean is not None and None not in base \
            else None
        seeds = ", ".join("diverged" if a is None else f"{a:.2%}" for a in accs)
        print(f"| {opt} | {codec} | {mode} | {'diverged' if mean is None else f'{mean:.2%}'} | "
              f"{'' if codec == 'none' or gap is None else f'{gap:+.2f}'} | {seeds} |")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"codec": c, "optimizer": o, "correction": m, "accuracy": a}
             for (c, o, m), a in table.items()], indent=1))


if __name__ == "__main__":
    main()
