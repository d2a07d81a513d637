"""The consensus step of compressed gossip (strategy.gamma): 0.5 for every codec against the
default, which sets it from the codec (strategies/gossip.py, auto_gamma).

    python benchmarks/gossip_gamma.py [--steps 300]

sgp on 4 simulated workers, one of them 3x slower (compute.slowdown = [1, 1, 1, 3]), and
dpsgd on the 4x4 torus with topk at 1%: the MLP on scikit-learn's digits (no download), batch
32, the default optimizer, fixed compute of 3 ms a step, seed 0. Prints a Markdown table of
the accuracy at each evaluation (every 50 steps), or the error that ended the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402

import fastsgd as fs  # noqa: E402
from fastsgd.errors import UserError  # noqa: E402
from fastsgd.workloads.data import load_dataset  # noqa: E402

CELLS = [("sgp", codec, {"compute.slowdown": [1, 1, 1, 3]}, 4)
         for codec in ("topk", "randomk", "dgc", "onebit", "sign", "qsgd")]
CELLS.append(("dpsgd", "topk", {"strategy.topology": "torus", "compression.ratio": 0.01}, 16))


def run(strategy: str, codec: str, extra: dict, workers: int, gamma: float, steps: int,
        data) -> str:
    with TemporaryDirectory() as out:
        options = {"run.steps": steps, "run.eval_every": 50, "strategy.name": strategy,
                   "compression.name": codec, "strategy.gamma": gamma,
                   "compute.model": "fixed", "compute.step_time": "3ms", "run.out": out,
                   **extra}
        try:
            result = fs.Job(model="mlp", data=data, options=options,
                            quiet=True).simulate(workers)
        except UserError as e:  # a diverged run: the loss was NaN too long
            return str(e).split(":")[1].strip().split(",")[0]
        evals = [json.loads(line)["accuracy"] for line in (result.run_dir / "eval.jsonl").open()]
    return " ".join(f"{100 * a:.1f}" for a in evals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    data = load_dataset("digits", seed=0)
    print(f"{cpu_name()}; accuracy (%) every 50 steps")
    print("| strategy (workers) | codec | gamma 0.5 | default gamma |")
    print("| --- | --- | --- | --- |")
    for strategy, codec, extra, workers in CELLS:
        rows = [run(strategy, codec, extra, workers, g, args.steps, data) for g in (0.5, 0.0)]
        print(f"| {strategy} ({workers}) | {codec} | {rows[0]} | {rows[1]} |", flush=True)


if __name__ == "__main__":
    main()
