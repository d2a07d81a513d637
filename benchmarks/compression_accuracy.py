"""Accuracy at a fraction of the bytes: every codec on `allreduce` and `dpsgd`.

    python benchmarks/compression_accuracy.py [--epochs 2] [--only topk,dgc] [--strategies dpsgd]

LeNet on Fashion-MNIST, 4 real worker processes, batch 32 per worker, SGD lr 0.05 momentum
0.9. dpsgd runs on a ring (4 workers: the 2x2 torus is the same graph); with a lossy codec it
is CHOCO-gossip with step `strategy.gamma` (0.5). dgc carries the momentum itself (momentum
correction), so the optimizer's momentum is 0 there. Each line: final accuracy, its gap to
`none` on the same strategy, and total bytes sent as a fraction of `none`'s.
"""

from __future__ import annotations

import argparse
import tempfile

import fastsgd as fs

CODECS = {
    "none": {}, "fp16": {}, "bf16": {}, "onebit": {}, "sign": {}, "qsgd": {},
    "topk": {"compression.ratio": 0.01}, "randomk": {"compression.ratio": 0.01},
    "dgc": {"compression.ratio": 0.001, "compression.warmup_steps": 400,
            "optimizer.momentum": 0.0},
    "powersgd": {"compression.rank": 4},
}
STRATEGIES = {"allreduce": {}, "dpsgd": {"strategy.topology": "ring"}}
POINT_TO_POINT = {"powersgd"}  # needs an all-reduce of its factors: not on gossip edges


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--only", default="", help="comma-separated codec names (none always runs)")
    p.add_argument("--strategies", default="allreduce,dpsgd")
    args = p.parse_args()
    codecs = ["none", *[c for c in args.only.split(",") if c and c != "none"]] if args.only \
        else list(CODECS)
    for strategy in args.strategies.split(","):
        base = None
        for codec in codecs:
            if strategy == "dpsgd" and codec in POINT_TO_POINT:
                continue
            s = run(strategy, codec, args.epochs)
            base = base or s
            print(f"{strategy:9s} {codec:9s} accuracy {s['final_accuracy']:.2%} "
                  f"({100 * (s['final_accuracy'] - base['final_accuracy']):+.2f} points)  "
                  f"bytes {s['bytes_sent_total'] / base['bytes_sent_total']:.4f} of none "
                  f"({s['bytes_sent_total']:.3g})", flush=True)


def run(strategy: str, codec: str, epochs: float) -> dict:
    with tempfile.TemporaryDirectory() as out:
        options = {"run.epochs": epochs, "run.eval_every": 0, "run.out": out,
                   "data.batch_size": 32, "compression.name": codec,
                   **STRATEGIES[strategy], **CODECS[codec]}
        job = fs.Job(model="lenet", data="fashion_mnist", strategy=strategy, options=options,
                     quiet=True)
        return job.run(workers=4).summary


if __name__ == "__main__":
    main()
