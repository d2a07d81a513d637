"""Accuracy at a fraction of the bytes: every codec on `allreduce` and `dpsgd`.

    python benchmarks/compression_accuracy.py [--epochs 8] [--only topk,dgc]
        [--strategies dpsgd] [--parallel 4] [--json results.json]

LeNet on Fashion-MNIST, 4 real worker processes, batch 32 per worker, plain SGD at lr 0.2
(no momentum: error feedback delays what a codec holds back, and heavy-ball momentum on top
of that delay diverges at any rate that trains fast; docs/compression.md). dgc carries
momentum 0.9 itself (momentum correction), so its rate is 0.2 * (1 - 0.9), the same step.
dpsgd runs on a ring (4 workers: the 2x2 torus is the same graph); with a lossy codec it is
CHOCO-gossip with step `strategy.gamma` (0.5). `--strategies adpsgd,sgp` runs the
asynchronous gossip strategies the same way. Each line: final accuracy, its gap to `none`
on the same strategy, and total bytes sent as a fraction of `none`'s. `--parallel N` runs N
jobs at once (4 N processes: give each a core).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from common import overrides

import fastsgd as fs

BASE = {"optimizer.lr": 0.2, "optimizer.momentum": 0.0, "data.batch_size": 32}
CODECS = {
    "none": {}, "fp16": {}, "bf16": {}, "onebit": {}, "sign": {}, "qsgd": {},
    "topk": {"compression.ratio": 0.01}, "randomk": {"compression.ratio": 0.1},
    "dgc": {"compression.ratio": 0.001, "compression.momentum": 0.9,
            "compression.warmup_steps": 400, "optimizer.lr": 0.02},
    "powersgd": {"compression.rank": 4},
}
STRATEGIES = {"allreduce": {}, "dpsgd": {"strategy.topology": "ring"},
              "adpsgd": {"strategy.topology": "ring"}, "sgp": {}}  # the last two: on request
# CHOCO's consensus step shrinks with the share a sparse codec keeps (Koloskova et al. 2019:
# gamma of the order of the compression quality): dpsgd's and sgp's default `gamma` (0)
# sets it from the codec (gossip.auto_gamma; before 2026-11-29 this script set 0.02 for topk
# and randomk, 0.005 for dgc). CHOCO compresses parameter differences with no error
# feedback, so dgc there is top-k with no momentum correction: full rate. adpsgd has no
# step: a lossy answer only mixes less.
GOSSIP: dict[tuple[str, str], dict] = {
    **{(s, "dgc"): {"optimizer.lr": 0.2} for s in ("dpsgd", "sgp", "adpsgd")},
}
POINT_TO_POINT = {"powersgd"}  # needs an all-reduce of its factors: not on gossip edges


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=8.0)
    p.add_argument("--only", default="", help="comma-separated codec names (none always runs)")
    p.add_argument("--strategies", default="allreduce,dpsgd")
    p.add_argument("--parallel", type=int, default=1, help="jobs at once")
    p.add_argument("--json", default="", help="also write every run's figures here")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an option in every run (e.g. strategy.gamma=0.1)")
    p.add_argument("--one", nargs=2, metavar=("STRATEGY", "CODEC"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run(*args.one, args.epochs, overrides(args.set))))
        return
    codecs = ["none", *[c for c in args.only.split(",") if c and c != "none"]] if args.only \
        else list(CODECS)
    jobs = [(s, c) for s in args.strategies.split(",") for c in codecs
            if not (s != "allreduce" and c in POINT_TO_POINT)]
    with ThreadPoolExecutor(args.parallel) as pool:
        results = dict(zip(jobs, pool.map(lambda job: in_subprocess(*job, args), jobs)))
    rows = report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def report(results: dict[tuple[str, str], dict]) -> list[dict]:
    rows = []
    for (strategy, codec), s in results.items():
        base = results[(strategy, "none")]
        row = {"strategy": strategy, "codec": codec, "accuracy": s["final_accuracy"],
               "points": 100 * (s["final_accuracy"] - base["final_accuracy"]),
               "bytes": s["bytes_sent_total"],
               "bytes_ratio": s["bytes_sent_total"] / base["bytes_sent_total"],
               "seconds": s.get("wall_time")}
        rows.append(row)
        print(f"{strategy:9s} {codec:9s} accuracy {row['accuracy']:.2%} "
              f"({row['points']:+.2f} points)  bytes {row['bytes_ratio']:.4f} of none "
              f"({row['bytes']:.3g})", flush=True)
    return rows


def in_subprocess(strategy: str, codec: str, args: argparse.Namespace) -> dict:
    """One run in a fresh interpreter (its own worker processes), its summary back as JSON."""
    command = [sys.executable, __file__, "--one", strategy, codec, "--epochs", str(args.epochs),
               *(f"--set={kv}" for kv in args.set)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"{strategy} {codec} failed:\n{out.stderr[-2000:]}", flush=True)
        return {"final_accuracy": float("nan"), "bytes_sent_total": float("nan")}
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  done: {strategy} {codec} {summary['final_accuracy']:.2%} in "
          f"{summary['wall_time']:.0f} s, {summary['bytes_sent_total']:.4g} bytes", flush=True)
    return summary




def run(strategy: str, codec: str, epochs: float, extra: dict) -> dict:
    with tempfile.TemporaryDirectory() as out:
        options = {"run.epochs": epochs, "run.eval_every": 0, "run.out": out,
                   "compression.name": codec, **BASE, **STRATEGIES[strategy], **CODECS[codec],
                   **GOSSIP.get((strategy, codec), {}),
                   **{k: v for k, v in extra.items()  # codec options: not for `none`
                      if codec != "none" or not k.startswith("compression.")}}
        job = fs.Job(model="lenet", data="fashion_mnist", strategy=strategy, options=options,
                     quiet=True)
        return job.run(workers=4).summary


if __name__ == "__main__":
    main()
