"""Real asynchrony: with one of 4 worker processes slowed 3x, asynchronous strategies keep
the others busy while synchronous all-reduce waits for the straggler every step; sgp and
adpsgd as they are by default (max_lag 16: nobody more than 16 steps ahead of a neighbour)
and unbounded (`-0`, max_lag = 0).

    python benchmarks/async_stragglers.py [--steps 150] [--model lenet] [--data fashion_mnist]

Each strategy trains on 4 real gloo processes (this machine), worker 3 with
`compute.slowdown = [1, 1, 1, 3]`. Samples per second is the sum over workers of each one's own
rate (its samples over the time it took, up to its last step, where asynchronous strategies
drain what is still on the wire), as summary.json reports it, and how long the run took (its
last worker's last step: with a fixed number of steps, the straggler's). On a machine with
fewer cores than workers the fast workers share the cores; `--simulate` gives each its own.
"""

from __future__ import annotations

import argparse
import tempfile

import fastsgd as fs

STRATEGIES = [  # (label, strategy, options)
    ("allreduce", "allreduce", {}),
    ("ps", "ps", {"optimizer.lr": 0.0125}),  # the server sums 4 workers' steps: lr / 4
    ("adpsgd", "adpsgd", {}),  # max_lag 16: the others run at most 16 steps ahead of it
    ("adpsgd-0", "adpsgd", {"strategy.max_lag": 0}),  # unbounded
    ("sgp", "sgp", {}),
    ("sgp-0", "sgp", {"strategy.max_lag": 0}),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--model", default="lenet")
    p.add_argument("--data", default="fashion_mnist")
    p.add_argument("--slowdown", type=float, default=3.0)
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--simulate", action="store_true",
                   help="simulated cluster: every worker has a core of its own")
    args = p.parse_args()
    rates = {}
    for label, name, extra in STRATEGIES:
        with tempfile.TemporaryDirectory() as out:
            options = {"run.steps": args.steps, "run.eval_every": 0, "run.out": out,
                       "compute.slowdown": [1, 1, 1, args.slowdown], "data.batch_size": args.batch,
                       **extra}
            job = fs.Job(model=args.model, data=args.data, strategy=name, options=options,
                         quiet=True)
            summary = (job.simulate(workers=4) if args.simulate else job.run(workers=4)).summary
        rate = rates[label] = summary["samples_per_second"]
        took = summary["simulated_time" if args.simulate else "wall_time"]
        print(f"{label:10s} {rate:9.1f} samples/s  x{rate / rates['allreduce']:.2f} "
              f"of allreduce  (accuracy {summary['final_accuracy']:.2%} after {args.steps} "
              f"steps; the run took {took:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
