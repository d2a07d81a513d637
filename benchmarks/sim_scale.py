"""How far the simulated cluster scales on one machine: wall time per simulated worker-step
against the bare step, and peak memory, at 16 to 1024 logical workers.

    python benchmarks/sim_scale.py [--workers 16 256 1024] [--strategies allreduce dpsgd sgp]
                                   [--model mlp|lenet|linear] [--steps 100] [--json FILE]

The simulator runs every logical worker's own forward, backward and optimizer step in one
process, so a simulated worker-step can never cost less than a bare step; the rest
(scheduling, the copies the simulated transport makes, the strategy, per-step bookkeeping)
is overhead, and its memory per worker decides how many workers fit. Each configuration
runs `Job.simulate` in a fresh subprocess (peak RSS is that process's VmHWM) on
Fashion-MNIST, batch 32 per worker, SGD lr 0.05 momentum 0.9, evaluation at the end only.
The same subprocess first times the bare step: forward, cross-entropy, backward and
`optimizer.step()` on one model of the same kind, on the same batches, in a plain loop,
with the optimizer the simulated workers get (`[optimizer]`: torch's SGD, multi-tensor).
dpsgd runs on the one-peer exponential graph (`strategy.topology = "onepeer"`, sgp's
default). Wall and CPU seconds per worker-step are the simulation's (dataset loading
excluded; setup and the final evaluation included) over workers x steps; the CPU column,
unlike wall time, does not count time other processes on a shared machine took.

After the simulation (its peak RSS taken) it times the loop: the same plain step going
round one model per worker, each with its own optimizer and shard, as the simulator steps
its workers. That is the compute alone of N replicas that no longer fit in the cache, the
floor of anything that steps each replica: `loop ms`, and `/loop`, the simulation's time
per worker-step over it, which is the simulator's own overhead apart from the machine's.

Both run on one intra-op thread by default (`--threads`): on a 2-core machine shared with
other jobs a second OpenMP thread that gets descheduled stalls every op (the bare MLP step
took 15 ms instead of 1.2 ms). The simulation computes its workers' steps on its compute
lanes, one thread per core by default (`--set compute.lanes=0`: all on the scheduler's
thread; docs/simulator.md); `lanes` in the table is how many it had.

Today's figures are in docs/simulator.md ("Scale and speed"). Measured at commit 1f7c55e's
simulator, before the changes that section lists (2 cores, AMD EPYC, 24 GiB, shared with other jobs:
load average about 4, so wall times are noisy; `python benchmarks/sim_scale.py` and
`--model lenet --workers 256 --strategies allreduce dpsgd`), 100 steps:

    model strategy  workers  ms/ws  bare ms  ratio  cpu ms/ws  peak GB  MB/worker
    mlp   allreduce      16   2.51     0.98   2.55       2.11     0.74      14.9
    mlp   dpsgd          16   2.38     0.96   2.48       2.31     0.71      12.6
    mlp   sgp            16   4.74     0.94   5.03       4.49     1.29      50.1
    mlp   allreduce     256   3.46     0.96   3.62       2.43     3.46      11.8
    mlp   dpsgd         256   4.51     1.32   3.41       2.74     3.58      12.3
    mlp   sgp           256   stopped: RSS over 16 GB (float64 edge copies per peer)
    mlp   allreduce    1024   4.64     1.06   4.38       3.42    11.48      11.0
    mlp   dpsgd        1024   4.94     1.91   2.59       3.67    13.38      12.9
    lenet allreduce     256   7.92     3.29   2.41       5.60     1.42       3.6
    lenet dpsgd         256   7.49     3.55   2.11       5.97     1.48       3.8

Far from the goals (at most 1.3x the bare step; 6 GiB at 1024 MLP workers): where the
time and memory go, and what would fix it, is in the report of issue 10, item 6.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import torch
import torch.nn.functional as F

import fastsgd as fs
from fastsgd.config.toml_files import parse_override
from fastsgd.loop.components import optimizer_from_config
from fastsgd.transport.sim.lanes import cores
from fastsgd.workloads.data import Shard, load_dataset
from fastsgd.workloads.dataset import Dataset
from fastsgd.workloads.models import build_model

BATCH, LR, MOMENTUM = 32, 0.05, 0.9
SGD = optimizer_from_config({"name": "sgd", "lr": LR, "momentum": MOMENTUM, "nesterov": False,
                             "weight_decay": 0.0})  # the optimizer the runs build
STRATEGY_OPTIONS = {"dpsgd": {"strategy.topology": "onepeer"}}


def _status_mb(key: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def make_model(name: str, data: Dataset) -> torch.nn.Module:
    """`linear` is one Linear layer, whose compute is next to nothing: what a simulated
    worker-step costs beyond it is the simulator's own machinery (docs/simulator.md)."""
    if name == "linear":
        c, h, w = data.input_shape
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(c * h * w,
                                                                       data.num_classes))
    return build_model(name, data.input_shape, data.num_classes)


def bare_step_ms(model_name: str, data: Dataset, replicas: int = 1, steps: int = 100,
                 repeats: int = 5) -> tuple[float, float]:
    """Wall and CPU milliseconds of one plain forward+backward+SGD step: the fastest of
    `repeats` rounds (other processes on a shared machine only ever slow a round down).
    With `replicas`, the steps go round that many models, each with its own optimizer and
    shard, as the simulator steps its workers: the compute alone, without the simulation,
    of replicas that no longer all fit in the cache. Gradients are freed right after each
    step, as the simulator frees them: the fastest such loop is the floor."""
    torch.manual_seed(0)
    models = [make_model(model_name, data) for _ in range(replicas)]
    optimizers = [SGD(m.parameters()) for m in models]  # the simulated workers' own
    shards = [Shard(data.train_x, data.train_y, BATCH, r, replicas, seed=0)
              for r in range(replicas)]
    steps = -(-steps // replicas) * replicas  # whole rounds over the replicas
    k = 0
    walls, cpus = [], []
    for rep in range(repeats + 1):  # the first round warms up
        wall, cpu = time.perf_counter(), _cpu()
        for _ in range(steps):
            r = k % replicas
            x, y = shards[r].batch(k // replicas)
            k += 1
            optimizers[r].zero_grad()
            F.cross_entropy(models[r](x), y).backward()
            optimizers[r].step()
            optimizers[r].zero_grad()  # freed at once, as the simulator does: the next
            # replica's backward takes that memory while it is in the cache (N replicas:
            # 0.1 ms a step less at 256 MLP replicas here than freeing it at the next visit)
        if rep:
            walls.append((time.perf_counter() - wall) / steps * 1e3)
            cpus.append((_cpu() - cpu) / steps * 1e3)
    return min(walls), min(cpus)


def _watch_rss(limit_mb: float) -> None:
    """Exit (status 3) once this process's RSS passes `limit_mb`, before the machine's OOM
    killer picks a victim of its own."""
    def watch() -> None:
        while True:
            if _status_mb("VmRSS") > limit_mb:
                print(f"RSS over --max-rss-gb ({limit_mb / 1024:.1f} GB): stopped",
                      file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(0.2)
    threading.Thread(target=watch, daemon=True, name="rss-watch").start()


def measure(model: str, strategy: str, workers: int, steps: int, log_every: int = 1,
            threads: int = 1, settings: dict[str, str] | None = None) -> dict[str, Any]:
    """One configuration, in this process: bare step, then the simulated run."""
    if threads:
        torch.set_num_threads(threads)
    data = load_dataset("fashion_mnist")
    bare_wall, bare_cpu = bare_step_ms(model, data)
    base_mb = _status_mb("VmRSS")  # the dataset and one model: what any run holds
    with tempfile.TemporaryDirectory() as out:
        options = {"run.steps": steps, "run.eval_every": 0, "run.out": out,
                   "run.log_every": log_every, "run.target_accuracy": 0,
                   "data.batch_size": BATCH, "optimizer.lr": LR,
                   "optimizer.momentum": MOMENTUM, **STRATEGY_OPTIONS.get(strategy, {}),
                   **(settings or {})}
        job = fs.Job(model=(lambda: make_model(model, data)) if model == "linear" else model,
                     data=data, strategy=strategy, options=options, quiet=True)
        lanes = int(options.get("compute.lanes", -1))  # none of these models draws
        lanes = cores() if lanes < 0 else lanes  # random numbers: what simulate takes
        wall, cpu = time.perf_counter(), _cpu()
        summary = job.simulate(workers=workers).summary or {}
        wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    worker_steps = workers * steps
    peak_mb = _status_mb("VmHWM")
    after_wall, after_cpu = bare_step_ms(model, data)  # again: the machine may have changed
    bare_wall, bare_cpu = min(bare_wall, after_wall), min(bare_cpu, after_cpu)
    del job
    loop_wall, _ = bare_step_ms(model, data, replicas=workers, repeats=3)  # after the peak
    return {"model": model, "strategy": strategy, "workers": workers, "steps": steps,
            "wall_s": wall, "ms_per_worker_step": wall / worker_steps * 1e3,
            "cpu_ms_per_worker_step": cpu / worker_steps * 1e3,
            "bare_ms": bare_wall, "bare_cpu_ms": bare_cpu,
            "ratio": wall / worker_steps * 1e3 / bare_wall,
            "loop_ms": loop_wall, "loop_ratio": loop_wall / bare_wall,
            "over_loop": wall / worker_steps * 1e3 / loop_wall,
            # the training loop alone (rank 0's, after setup, before the final evaluation)
            "train_ms_per_worker_step": summary.get("wall_time", 0) / worker_steps * 1e3,
            "train_ratio": summary.get("wall_time", 0) / worker_steps * 1e3 / bare_wall,
            "peak_rss_mb": peak_mb, "base_rss_mb": base_mb,
            "mb_per_worker": (peak_mb - base_mb) / workers,
            "threads": torch.get_num_threads(), "accuracy": summary.get("final_accuracy"),
            "lanes": lanes,
            "settings": settings or {}}


def run_child(model: str, strategy: str, workers: int, steps: int,
              args: argparse.Namespace) -> dict[str, Any]:
    """`measure` in a fresh interpreter: its peak RSS is this configuration's alone."""
    cmd = [sys.executable, __file__, "--one", model, strategy, str(workers), str(steps),
           "--log-every", str(args.log_every), "--threads", str(args.threads),
           "--max-rss-gb", str(args.max_rss_gb), *(f"--set={kv}" for kv in args.set)]
    env = {**os.environ, "LD_PRELOAD": args.malloc} if args.malloc else None
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"model": model, "strategy": strategy, "workers": workers, "steps": steps,
                "error": (done.stderr.strip().splitlines() or ["killed"])[-1],
                "returncode": done.returncode}
    return json.loads(done.stdout.strip().splitlines()[-1])


HEADER = (f"{'model':6} {'strategy':10} {'workers':>7} {'steps':>5} {'wall s':>8} "
          f"{'ms/ws':>7} {'bare ms':>7} {'ratio':>6} {'loop ms':>7} {'/loop':>5} {'cpu ms/ws':>9} "
          f"{'bare cpu':>8} "
          f"{'train ratio':>11} {'peak GB':>7} {'MB/worker':>9} {'acc':>6} {'lanes':>5}")


def row(r: dict[str, Any]) -> str:
    head = f"{r['model']:6} {r['strategy']:10} {r['workers']:>7} {r['steps']:>5}"
    if "error" in r:
        return f"{head} failed (exit {r['returncode']}): {r['error']}"
    acc = f"{r['accuracy']:.3f}" if r["accuracy"] is not None else "-"
    return (f"{head} {r['wall_s']:8.1f} {r['ms_per_worker_step']:7.3f} {r['bare_ms']:7.3f} "
            f"{r['ratio']:6.2f} {r.get('loop_ms', 0):7.3f} {r.get('over_loop', 0):5.2f} "
            f"{r['cpu_ms_per_worker_step']:9.3f} {r['bare_cpu_ms']:8.3f} "
            f"{r.get('train_ratio', 0):11.2f} {r['peak_rss_mb'] / 1024:7.2f} "
            f"{r['mb_per_worker']:9.2f} {acc:>6} {r.get('lanes', '-'):>5}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[16, 256, 1024])
    p.add_argument("--strategies", nargs="+", default=["allreduce", "dpsgd", "sgp"])
    p.add_argument("--model", default="mlp", choices=["mlp", "lenet", "linear"],
                   help="linear: one layer, so that the simulator's own cost shows")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--log-every", type=int, default=1, help="run.log_every")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads, bare loop and simulation alike (0: torch's "
                   "default)")
    p.add_argument("--max-rss-gb", type=float, default=16.0,
                   help="stop a configuration whose RSS passes this")
    p.add_argument("--malloc", metavar="LIB",
                   help="preload this allocator in the runs (LD_PRELOAD), e.g. "
                   "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 (Debian's libjemalloc2)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a fastsgd key for every run (repeatable), e.g. network.bandwidth=100Gbit")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--one", nargs=4, metavar=("MODEL", "STRATEGY", "WORKERS", "STEPS"),
                   help=argparse.SUPPRESS)  # the child: one configuration, a JSON line
    args = p.parse_args()
    if args.one:
        model, strategy, workers, steps = args.one
        _watch_rss(args.max_rss_gb * 1024)
        settings = dict(parse_override(kv) for kv in args.set)  # as `fastsgd --set` reads
        print(json.dumps(measure(model, strategy, int(workers), int(steps), args.log_every,
                                 args.threads, settings)))
        return
    if any("=" not in kv for kv in args.set):
        sys.exit(f"--set {next(kv for kv in args.set if '=' not in kv)}: expected KEY=VALUE")
    if args.malloc and not os.path.exists(args.malloc):
        sys.exit(f"--malloc {args.malloc}: no such file")
    print(HEADER, flush=True)
    rows = []
    for workers in args.workers:
        for strategy in args.strategies:
            rows.append(run_child(args.model, strategy, workers, args.steps, args))
            print(row(rows[-1]), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
