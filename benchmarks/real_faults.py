"""Real worker processes that lose workers halfway and carry on (no restart, no checkpoint).

    python3 benchmarks/real_faults.py [--strategies sgp adpsgd ps ltfb dpsgd] [--workers 4]
        [--steps 1500] [--kill 1] [--json FILE]

MLP on Fashion-MNIST, `fastsgd run` with its own worker processes, batch 32 each, the demo's
optimizer (SGD lr 0.05, momentum 0.9) for every strategy. Each strategy runs twice: once
undisturbed, once while this script kill -9s `--kill` worker processes (the highest ranks:
rank 0 writes the results, and ps's server is rank 0) as soon as the run's log shows half of
the steps done. Reported: the lost workers and the steps they had done (summary.json), the
final accuracy and the time to 85% against the undisturbed run, wall time. The survivors'
real runs depend on timing, so accuracies move by a few tenths between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402
from soak import children  # noqa: E402


def steps_logged(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return max((json.loads(line)["step"] for line in lines[-8:] if line.endswith("}")),
               default=0)


def run(strategy: str, args: argparse.Namespace, out: Path, kill: int) -> dict[str, Any]:
    sets = ["model.name=mlp", f"strategy.name={strategy}", f"run.workers={args.workers}",
            f"run.steps={args.steps}", f"run.eval_every={args.steps // 10}",
            "run.target_accuracy=0.85", f"run.out={out}"]
    cmd = [sys.executable, "-m", "fastsgd", "run", "--quiet",
           *[a for s in sets for a in ("--set", s)]]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    while kill and proc.poll() is None and steps_logged(out) < args.steps // 2:
        time.sleep(0.05)
    workers = sorted(children(proc.pid))  # forked in rank order: ascending pids
    for pid in workers[len(workers) - kill:] if kill and len(workers) == args.workers else []:
        os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate()
    if proc.returncode != 0:
        return {"strategy": strategy, "killed": kill, "error": err.strip().splitlines()[-1:]}
    summary = json.loads((out / "summary.json").read_text())
    return {"strategy": strategy, "killed": kill, "lost": summary["lost_workers"],
            "accuracy": summary["final_accuracy"], "time_to_85": summary["time_to_target"],
            "wall_s": round(time.monotonic() - began, 1), "stderr": err.strip()}


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", nargs="+", default=["sgp", "adpsgd", "ps", "ltfb", "dpsgd"])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--kill", type=int, default=1, help="workers killed halfway")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rows = []
    with TemporaryDirectory() as tmp:
        for strategy in args.strategies:
            for kill in (0, args.kill):
                rows.append(run(strategy, args, Path(tmp) / f"{strategy}-{kill}", kill))
                print(json.dumps(rows[-1]), flush=True)
    print(f"\n{cpu_name()}, {args.workers} workers, {args.steps} steps\n")
    print("| strategy | lost (worker: steps done) | accuracy | undisturbed | time to 85% "
          "| undisturbed |\n| --- | --- | --- | --- | --- | --- |")
    for calm, hit in zip(rows[::2], rows[1::2]):
        if "error" in calm or "error" in hit:
            print(f"| {calm['strategy']} | failed: {calm.get('error') or hit.get('error')} |")
            continue
        lost = ", ".join(f"{w['worker']}: {w['step']}" for w in hit["lost"])
        print(f"| {hit['strategy']} | {lost} | {hit['accuracy']:.2%} | {calm['accuracy']:.2%} "
              f"| {_seconds(hit['time_to_85'])} | {_seconds(calm['time_to_85'])} |")
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
