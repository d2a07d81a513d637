"""What a compressed all-reduce costs the simulator as the cluster grows: wall time per
worker-step of the training loop, per codec (docs/compression.md, "A worker's chunks at
once").

    python benchmarks/codec_scale.py [--codecs none onebit sign fp16 qsgd]
                                     [--workers 32 64] [--steps 10]

Each configuration is one `fastsgd simulate` in a subprocess: the MLP on Fashion-MNIST,
allreduce, compute fixed at 5 ms (the virtual clock does not depend on this machine),
evaluation at the end only. The figure is the summary's `wall_time` (the training loop,
after setup, before the final evaluation) over workers x steps: what the codec's encodes,
decodes and packing add to the simulated worker's own step.
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import cpu_name, simulate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codecs", nargs="+", default=["none", "onebit", "sign", "fp16",
                                                        "qsgd"])
    parser.add_argument("--workers", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print(f"{cpu_name()}, torch {torch.__version__}; ms of wall time per worker-step")
    print("| codec | workers | ms per worker-step |\n|---|---|---|")
    failed = 0
    for codec in args.codecs:
        for workers in args.workers:
            summary = simulate([f"compression.name={codec}", f"run.workers={workers}",
                                f"run.steps={args.steps}", "model.name=mlp",
                                "run.eval_every=0", "run.target_accuracy=0",
                                "compute.model=fixed", "compute.step_time=5ms"])
            if summary is None:
                failed += 1
                print(f"| {codec} | {workers} | failed |")
                continue
            ms = summary["wall_time"] / (workers * args.steps) * 1e3
            print(f"| {codec} | {workers} | {ms:.1f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
