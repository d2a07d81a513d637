"""The paper's open question (Viviani et al. 2019, §III-A): what partial, delayed or compressed
communication does to momentum and adaptive optimizers. One table, optimizer x strategy x
codec, at 16 simulated workers.

    python benchmarks/optimizer_table.py [--steps 600] [--jobs 2] [--json out.json]
        [--only-strategies allreduce,ps] [--only-optimizers adam] [--only-codecs topk]

MLP on Fashion-MNIST, 16 simulated workers, batch 32 each (global 512), fixed compute of 1 ms
a forward + backward, a 1 Gbit/s, 50 us network; every strategy and codec at its defaults
(with the staleness-aware optimizer settings and momentum correction they bring), but
`diloco` at period 50 (its 500 is longer than the run) and `dpsgd` on the 4 x 4 torus. Each
optimizer at the settings one tunes for synchronous SGD: plain SGD lr 0.2; momentum 0.9 and
Nesterov lr 0.05; Adam lr 0.001. Each cell: final test accuracy, and the simulated time to
85% (evaluated every 25 steps, for free in simulation).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import simulate

OPTIMIZERS = {
    "sgd": ["optimizer.lr=0.2", "optimizer.momentum=0.0"],
    "momentum": ["optimizer.lr=0.05", "optimizer.momentum=0.9"],
    "nesterov": ["optimizer.lr=0.05", "optimizer.momentum=0.9", "optimizer.nesterov=true"],
    "adam": ["optimizer.name=adam", "optimizer.lr=0.001"],
}
STRATEGIES = {"allreduce": [], "ssp": [], "ps": [], "dpsgd": ["strategy.topology=torus"],
              "sgp": [], "localsgd": [], "diloco": ["strategy.period=50"]}
CODECS = ["none", "onebit", "topk"]
BASE = ["model.name=mlp", "run.workers=16", "data.batch_size=32", "compute.model=fixed",
        "compute.step_time=1ms", "network.bandwidth=1Gbit", "network.latency=50us",
        "run.eval_every=25", "run.target_accuracy=0.85", "run.seed=1"]


def cell(optimizer: str, strategy: str, codec: str, steps: int) -> dict | None:
    sets = [*BASE, f"run.steps={steps}", f"strategy.name={strategy}", *STRATEGIES[strategy],
            f"compression.name={codec}", *OPTIMIZERS[optimizer]]
    summary = simulate(sets)
    print(f"{optimizer} {strategy} {codec}: {show(summary)}", file=sys.stderr, flush=True)
    return summary


def show(summary: dict | None) -> str:
    if summary is None:
        return "diverged"
    reached = summary["time_to_target"]
    when = f"{reached:.2f} s" if reached is not None else "not reached"
    return f"{summary['final_accuracy']:.2%}, {when}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only-strategies", default=",".join(STRATEGIES))
    ap.add_argument("--only-optimizers", default=",".join(OPTIMIZERS))
    ap.add_argument("--only-codecs", default=",".join(CODECS))
    ap.add_argument("--json")
    args = ap.parse_args()
    strategies, optimizers = args.only_strategies.split(","), args.only_optimizers.split(",")
    codecs = args.only_codecs.split(",")
    cells = [(o, s, c) for o in optimizers for s in strategies for c in codecs]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda x: cell(*x, args.steps), cells))
    found = dict(zip(cells, results))
    print(f"MLP, Fashion-MNIST, 16 simulated workers, batch 32, {args.steps} steps, 1 Gbit/s "
          "50 us, 1 ms compute; each cell: final accuracy, simulated time to 85%\n")
    print("| optimizer | strategy | " + " | ".join(codecs) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in codecs) + " |")
    for o in optimizers:
        for s in strategies:
            print(f"| {o} | {s} | " + " | ".join(show(found[(o, s, c)]) for c in codecs) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"optimizer": o, "strategy": s, "codec": c, "summary": r}
             for (o, s, c), r in found.items()], indent=1))


if __name__ == "__main__":
    main()
