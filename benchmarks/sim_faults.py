"""Losing workers halfway: what happens to accuracy and time to target (the FAST paper's
question, ../shared/seeds/003: can workers be terminated at any time without hurting
convergence?).

    python benchmarks/sim_faults.py [--workers 64] [--steps 400] [--drop 0 0.1 0.25 0.5]
        [--strategies allreduce dpsgd sgp ps] [--rejoin] [--jobs 2] [--json out.json]

MLP on Fashion-MNIST, simulated workers with batch 32 each, SGD lr 0.05 momentum 0.9 (the
synchronous settings, for every strategy), fixed compute of 5 ms a step (a GPU's, and the
outcome does not depend on this machine's load), 10 Gbit/s links. dpsgd runs on the 2D
torus, ps with 8 server shards (one server's downlink cannot take 64 pushes a step). A
fraction of the workers (drawn with a fixed seed from ranks 8 and up: the servers' ranks
cannot crash yet, and rank 0 writes the results) crashes at the same step halfway through;
the survivors notice 1 s later (faults.detect). Prints a Markdown table: final accuracy, time
to the target accuracy and simulated time, each against the same strategy with no faults.
With --rejoin (run.rejoin; sgp, dpsgd and ps), a new process takes each lost worker's place
from a live worker's state, started --restart after the loss is known (faults.restart); the
table then also counts the workers back.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name, simulate  # noqa: E402

BASE = ["model.name=mlp", "data.batch_size=32", "compute.model=fixed", "compute.step_time=5ms",
        "network.bandwidth=10Gbit", "optimizer.name=sgd", "optimizer.lr=0.05",
        "optimizer.momentum=0.9", "run.eval_every=20", "run.target_accuracy=0.85"]
OPTIONS = {"dpsgd": ["strategy.topology=torus"], "ps": ["strategy.servers=8"]}
SPARED = 8  # ranks 0..7 never crash: ps's servers (and rank 0 writes the results)


def crashes(workers: int, fraction: float, step: int) -> str:
    lost = sorted(random.Random(0).sample(range(SPARED, workers), round(fraction * workers)))
    return "[" + ", ".join(f"{{worker = {r}, step = {step}}}" for r in lost) + "]"


def cell(strategy: str, fraction: float, args: argparse.Namespace) -> dict:
    sets = [*BASE, f"run.workers={args.workers}", f"run.steps={args.steps}",
            f"strategy.name={strategy}", *OPTIONS.get(strategy, []),
            f"faults.crash={crashes(args.workers, fraction, args.steps // 2)}",
            f"faults.detect={args.detect}", f"faults.restart={args.restart}",
            f"run.rejoin={str(args.rejoin).lower()}"]
    began = time.perf_counter()
    summary = simulate(sets) or {}
    return {"strategy": strategy, "drop": fraction, "wall": time.perf_counter() - began,
            **{k: summary.get(k) for k in ("final_accuracy", "time_to_target",
                                          "simulated_time", "lost_workers",
                                          "rejoined_workers")}}


def table(cells: list[dict]) -> str:
    rows = ["| strategy | lost | final accuracy | vs none | time to 85% (s) | vs none | "
            "simulated time (s) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    base = {c["strategy"]: c for c in cells if c["drop"] == 0}
    for c in cells:
        b = base.get(c["strategy"], {})
        acc, tt = c["final_accuracy"], c["time_to_target"]
        gap = (f"{100 * (acc - b['final_accuracy']):+.2f}" if acc is not None
               and b.get("final_accuracy") is not None else "-")
        slower = (f"{tt / b['time_to_target']:.2f}x" if tt and b.get("time_to_target") else "-")
        lost = len(c["lost_workers"] or []) + len(c.get("rejoined_workers") or [])
        back = f", {len(c['rejoined_workers'])} back" if c.get("rejoined_workers") else ""
        rows.append(f"| {c['strategy']} | {lost} ({100 * c['drop']:.0f}%){back} | "
                    f"{'failed' if acc is None else f'{100 * acc:.2f}%'} | {gap} | "
                    f"{'-' if tt is None else f'{tt:.2f}'} | {slower} | "
                    f"{c['simulated_time'] or 0:.2f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--drop", type=float, nargs="+", default=[0, 0.1, 0.25, 0.5])
    ap.add_argument("--strategies", nargs="+", default=["allreduce", "dpsgd", "sgp", "ps"])
    ap.add_argument("--rejoin", action="store_true", help="new processes take the lost "
                    "workers' places (run.rejoin)")
    ap.add_argument("--detect", default="1s", help="faults.detect")
    ap.add_argument("--restart", default="2s", help="faults.restart (with --rejoin)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    grid = [(s, d) for s in args.strategies for d in args.drop]
    with ThreadPoolExecutor(args.jobs) as pool:
        cells = list(pool.map(lambda sd: cell(*sd, args), grid))
    rejoin = f", run.rejoin (restart {args.restart})" if args.rejoin else ""
    print(f"{args.workers} simulated workers, {args.steps} steps, crashes at step "
          f"{args.steps // 2}, detect {args.detect}{rejoin}; {cpu_name()}")
    print(table(cells))
    if args.json:
        args.json.write_text(json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
