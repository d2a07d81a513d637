"""Every strategy trains: LeNet on Fashion-MNIST, 4 real worker processes, final accuracy.

    python benchmarks/strategies_accuracy.py [--epochs N] [--only dpsgd,sgp] [--simulate]
        [--set compression.name=powersgd ...]

Batch 32 per worker, SGD lr 0.05 momentum 0.9, 3 epochs, except: where the strategy adds up
every worker's steps into one model (hogwild): lr / 4; ltfb, whose four models each train
alone on batch 32 (the synchronous rate is for a global batch of 128): lr / 4, and more
epochs, since each model sees a quarter of the data; ps: pushes scaled by 1/staleness and
more epochs; ssp, whose delayed gradients with momentum 0.9 diverged at lr 0.05: lr 0.02.
The epochs set per strategy below are what docs/strategies.md reports; `--epochs` overrides
them all.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import overrides

import fastsgd as fs

RUNS = {
    "allreduce": {}, "ssp": {"strategy.staleness": 2, "optimizer.lr": 0.02},
    "localsgd": {"strategy.period": 8}, "easgd": {"strategy.period": 4, "strategy.alpha": 0.2},
    "bmuf": {"strategy.period": 8}, "dpsgd": {"strategy.topology": "torus"},
    "adpsgd": {}, "sgp": {},
    # Zhang 2016: pushes scaled by 1/staleness
    "ps": {"strategy.staleness_lr": True, "run.epochs": 5},
    "hogwild": {"optimizer.lr": 0.0125},
    # the tournament winner; each model trains alone on batch 32
    "ltfb": {"strategy.period": 100, "run.representative": "best", "optimizer.lr": 0.0125,
             "run.epochs": 5},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=None,
                   help="for every strategy (default: 3, or the strategy's own setting)")
    p.add_argument("--only", default="", help="comma-separated strategy names")
    p.add_argument("--simulate", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for every strategy (after the strategy's own)")
    args = p.parse_args()
    names = args.only.split(",") if args.only else list(RUNS)
    for name in names:
        with tempfile.TemporaryDirectory() as out:
            options = {"run.epochs": 3.0, "run.eval_every": 0, "run.out": out,
                       "data.batch_size": 32, "run.target_accuracy": 0.85, **RUNS[name],
                       **overrides(args.set)}
            if args.epochs is not None:
                options["run.epochs"] = args.epochs
            job = fs.Job(model="lenet", data="fashion_mnist", strategy=name, options=options,
                         quiet=True)
            start = time.perf_counter()
            s = (job.simulate(workers=4) if args.simulate else job.run(workers=4)).summary
        print(f"{name:10s} accuracy {s['final_accuracy']:.2%}  {s['epochs']:.1f} epochs  "
              f"{time.perf_counter() - start:6.1f} s  bytes sent {s['bytes_sent_total']:.3g}  "
              f"consensus {s['consensus_distance']:.3g}", flush=True)


if __name__ == "__main__":
    main()
