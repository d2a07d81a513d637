"""What the simulator charges for a strategy's own work against what a real process spends
on it (issue 51, item 2): diloco's outer step and localsgd's average, on the GPT.

    python -m benchmarks.strategy_work [--workers 2] [--steps 60] [--period 10] [--width 128]
                                       [--repeats 1]

Real: `fastsgd run` on real processes (gloo on loopback), each round's wall time in the
strategy's hook less the time its all-reduces took (what the network model charges), the
median over the rounds and workers; a worker has just run its forward, backward and
update, so its caches are as a training run leaves them. Simulated: what `fastsgd simulate`
charges a round, `compute.strategy` as the profile measured it (the same strategy's round,
on one worker alone). Prints a table: per strategy both and their ratio (the issue asks for
within 10%), and the same for a forward + backward, the yardstick of what sharing the
machine with the other real workers costs (the simulator models workers that do not).
With `--repeats N` both are measured N times, alternately, and each column is the median
of its N figures: a shared machine's bursts then land on one repeat, not on the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import fastsgd as fs
from fastsgd.config import schema as cfg
from fastsgd.config.units import parse_seconds
from fastsgd.records.rundir import cpu_name
from fastsgd.strategies import CHOICES
from fastsgd.strategies.averaging import LocalSGD
from fastsgd.strategies.diloco import DiLoCo
from fastsgd.transport.base import Done


class Timed:
    """A strategy's on_parameters, timed: the hook's wall time less its all-reduces', for
    each call that did a round (Context.worked), kept per worker in `rounds`."""

    def init(self, params, ctx):  # noqa: ANN001, ANN201 - the strategy's signature
        self.rounds: list[float] = []
        return super().init(params, ctx)

    def on_parameters(self, params, state, ctx) -> None:  # noqa: ANN001
        transport, waited, worked = ctx.transport, [0.0], [0.0]
        all_reduce, charge = transport.all_reduce, ctx.worked

        def timed(tensor, async_op: bool = False, average: bool = False) -> Done:  # noqa: ANN001
            start = time.perf_counter()
            all_reduce(tensor, False, average).wait()
            waited[0] += time.perf_counter() - start
            return Done()

        def counted(share: float = 1.0) -> None:
            worked[0] += share
            charge(share)

        transport.all_reduce, ctx.worked = timed, counted
        try:
            start = time.perf_counter()
            super().on_parameters(params, state, ctx)
            spent = time.perf_counter() - start - waited[0]
        finally:
            del transport.all_reduce, ctx.worked
        if worked[0] and not ctx.last_step:  # the last step's round drains: not a mid-run one
            self.rounds.append(spent / worked[0])

    def close(self) -> None:
        if getattr(self, "rounds", None):
            with open(Path(os.environ[ROUNDS]) / f"{os.getpid()}-{id(self)}.json", "w") as f:
                json.dump(self.rounds, f)
        super().close()


class TimedDiLoCo(Timed, DiLoCo):
    name = "diloco"


class TimedLocalSGD(Timed, LocalSGD):
    name = "localsgd"


ROUNDS = "FASTSGD_BENCH_ROUNDS"  # the folder where workers leave their rounds' times


def options(args: argparse.Namespace, out: str) -> dict[str, Any]:
    return {"model.name": "gpt", "model.width": args.width, "data.name": "text",
            "optimizer.name": "adamw", "optimizer.lr": 1e-3, "run.steps": args.steps,
            "run.eval_every": 0, "run.tensorboard": False, "run.out": out}


def real(strategy: Timed, args: argparse.Namespace) -> tuple[float, float]:
    """The median seconds of a round's own work over the real workers' rounds, and of a
    forward + backward (metrics.jsonl), for scale: what sharing the machine's cores and
    memory with the other workers costs every phase alike."""
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as times:
        os.environ[ROUNDS] = times
        fs.Job(strategy=strategy, options=options(args, out), quiet=True,
               report=False).run(workers=args.workers)
        rounds = [r for f in Path(times).glob("*.json") for r in json.loads(f.read_text())]
        steps = [json.loads(line) for line in (Path(out) / "metrics.jsonl").open()]
    passes = [m["forward"] + m["backward"] for m in steps if m["step"] > 10]  # seconds
    return statistics.median(rounds), statistics.median(passes)


def charged(strategy: Timed, args: argparse.Namespace) -> tuple[float, float]:
    """compute.strategy, as the profile of `fastsgd simulate` measured it, and its forward +
    backward (a run of two rounds, the shortest the strategy does not warn of: the profile
    is the same for any length)."""
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as times:
        os.environ[ROUNDS] = times
        steps = 2 * args.period
        result = fs.Job(strategy=strategy, options={**options(args, out), "run.steps": steps},
                        quiet=True, report=False).simulate(workers=args.workers)
        compute = cfg.load(CHOICES, result.run_dir / "config.toml")["compute"]
    return (parse_seconds(compute["strategy"], "compute.strategy"),
            sum(parse_seconds(compute[k], f"compute.{k}") for k in ("forward", "backward")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--period", type=int, default=10)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    print(f"gpt width {args.width}, {args.workers} real workers, {args.steps} steps, "
          f"period {args.period}, median of {args.repeats}; machine: {cpu_name()}")
    # from the module, not __main__: a strategy class must be importable by its config
    from benchmarks.strategy_work import TimedDiLoCo, TimedLocalSGD
    print("| strategy | real round (ms) | simulated round (ms) | ratio | real forward + "
          "backward (ms) | simulated (ms) | ratio |\n|---|---|---|---|---|---|---|")
    for strategy in (TimedDiLoCo(period=args.period), TimedLocalSGD(period=args.period)):
        figures = [(*real(strategy, args), *charged(strategy, args))
                   for _ in range(args.repeats)]
        spent, passes, sim, sim_passes = (statistics.median(c) for c in zip(*figures))
        print(f"| {strategy.name} | {spent * 1e3:.2f} | {sim * 1e3:.2f} | {sim / spent:.2f} | "
              f"{passes * 1e3:.1f} | {sim_passes * 1e3:.1f} | {sim_passes / passes:.2f} |")


if __name__ == "__main__":
    main()
