"""How far real processes and the simulator end apart, beside how far training moves on its
own (issue 51, item 1): the same job real and simulated, and simulated again with the
learning rate changed by one part in a million.

    python -m benchmarks.parity_sensitivity [--strategies localsgd diloco] [--epochs 1]

The MLP on Fashion-MNIST, 4 workers, batch 64, lr 0.05 with momentum 0.9, no codec, each
strategy at its defaults. Where real-vs-simulated is no larger than the perturbed pair, the
gap is float rounding (gloo's ring sums in another order than the simulator) amplified by
training, not a difference of order.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from fastsgd.records.rundir import cpu_name
from fastsgd.testing.tiny import TinyJob, largest_difference, parameters, subject


def compare(strategy: str, epochs: float, folder: Path) -> dict[str, float]:
    options = {"data.name": "fashion_mnist", "data.batch_size": 64, "run.epochs": epochs}

    def job(lr: float) -> TinyJob:
        return TinyJob(subject("strategy", strategy, {}), subject("codec", "none", {}),
                       workers=4, steps=0, folder=folder, **options, **{"optimizer.lr": lr})

    runs = {"simulated": job(0.05).simulate("simulated").run_dir,
            "perturbed": job(0.05 * (1 + 1e-6)).simulate("perturbed").run_dir,
            "real": job(0.05).real("real").run_dir}
    model = {k: parameters(d) for k, d in runs.items()}
    accuracy = {k: json.loads((d / "summary.json").read_text())["final_accuracy"]
                for k, d in runs.items()}
    return {"real": largest_difference(model["real"], model["simulated"]),
            "perturbed": largest_difference(model["perturbed"], model["simulated"]),
            "largest": max(float(t.abs().max()) for t in model["simulated"].values()),
            **{f"accuracy {k}": v for k, v in accuracy.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", nargs="+", default=["localsgd", "diloco"])
    p.add_argument("--epochs", type=float, default=1.0)
    args = p.parse_args()
    print(f"MLP on fashion_mnist, 4 workers, {args.epochs:g} epoch(s); machine: {cpu_name()}")
    print("| strategy | real vs simulated | simulated vs lr x (1 + 1e-6) | largest parameter "
          "| accuracy simulated / perturbed / real |\n|---|---|---|---|---|")
    for strategy in args.strategies:
        with tempfile.TemporaryDirectory() as tmp:
            r = compare(strategy, args.epochs, Path(tmp))
        print(f"| {strategy} | {r['real']:.2g} | {r['perturbed']:.2g} | {r['largest']:.2g} | "
              f"{r['accuracy simulated']:.2%} / {r['accuracy perturbed']:.2%} / "
              f"{r['accuracy real']:.2%} |")


if __name__ == "__main__":
    main()
