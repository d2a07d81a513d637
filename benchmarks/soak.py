"""Soak: real worker processes killed (-9) again and again while they train; nothing lost.

    python3 benchmarks/soak.py [--strategies sgp dpsgd] [--workers 4] [--steps 6000]
                               [--kill-every 60] [--rejoin | --checkpoint-every 200]
                               [--eval-every N] [--keep DIR] [--json FILE]

For each strategy, `fastsgd run` trains the MLP on Fashion-MNIST twice with the same
settings: once undisturbed, once while this script kills a random worker process (SIGKILL)
every `--kill-every` seconds. Size `--steps` so that a run takes the minutes you want
(about 10 ms a step with 4 workers on a 2-core machine). The killed worker comes back:

- `--rejoin` (run.rejoin): a new process takes its place and joins the running run from a
  live worker's state, while the others train on. Reported: kills, rejoins (summary.json's
  `rejoined_workers`) and the steps they joined at, workers lost for good, whether every
  worker was there at the last step, final accuracy and wall time against the undisturbed
  run. (The killed process's last, unflushed lines of metrics.jsonl die with it.)
- else every worker restarts from the newest checkpoint (`run.on_failure = "restart"`).
  Reported: restarts (summary.json's `failures`) and the steps they went on from, and
  whether every step was logged exactly once per worker (nothing lost, nothing twice).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def children(pid: int) -> list[int]:
    """The launcher's worker processes."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except OSError:
        return []


def killer(pid: int, every: float, kills: list[float], stop: threading.Event,
           rng: random.Random) -> None:
    """Every `every` seconds, kill -9 one of `pid`'s workers."""
    began = time.monotonic()
    while not stop.wait(every):
        workers = children(pid)
        if workers:
            os.kill(rng.choice(workers), signal.SIGKILL)
            kills.append(round(time.monotonic() - began, 1))


def run(strategy: str, args: argparse.Namespace, out: Path, kill: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "fastsgd", "run", "--quiet",
           "--set", "model.name=mlp", "--set", f"strategy.name={strategy}",
           "--set", f"run.workers={args.workers}", "--set", f"run.steps={args.steps}",
           "--set", f"run.checkpoint_every={0 if args.rejoin else args.checkpoint_every}",
           "--set", f"run.rejoin={str(args.rejoin).lower()}",
           "--set", "run.max_restarts=1000",
           "--set", f"run.eval_every={args.eval_every or args.steps}",
           "--set", f"run.out={out}"]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    kills: list[float] = []
    stop = threading.Event()
    if kill:
        threading.Thread(target=killer, args=(proc.pid, args.kill_every, kills, stop,
                                              random.Random(args.seed)), daemon=True).start()
    _, err = proc.communicate()
    stop.set()
    wall = time.monotonic() - began
    if proc.returncode != 0:
        return {"strategy": strategy, "error": err.strip().splitlines()[-1:]}
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = sorted((m["step"], m["rank"]) for m in lines)
    expected = [(s, r) for s in range(1, args.steps + 1) for r in range(args.workers)]
    failures = summary.get("failures", [])
    row = {"strategy": strategy, "killed": kill, "kills": len(kills), "kill_times_s": kills,
           "accuracy": summary["final_accuracy"], "wall_s": round(wall, 1)}
    if args.rejoin:
        rejoined = summary["rejoined_workers"]
        at_end = sorted(m["rank"] for m in lines if m["step"] == args.steps)
        return {**row, "rejoins": len(rejoined),
                "joined_at": [r["joined_at_step"] for r in rejoined],
                "lost_for_good": len(summary["lost_workers"]),
                "all_at_the_end": at_end == list(range(args.workers))}
    return {**row, "restarts": len(failures), "every_step_once": logged == expected,
            "restarted_from": [f["from_step"] for f in failures]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", nargs="+", default=["sgp", "dpsgd"])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--kill-every", type=float, default=60.0)
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--rejoin", action="store_true",
                   help="a new worker joins in place of a killed one (run.rejoin)")
    p.add_argument("--seed", type=int, default=0, help="which workers get killed")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps (default: at the last step only)")
    p.add_argument("--keep", help="keep the run directories in this folder")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        for strategy in args.strategies:
            for kill in (False, True):
                name = f"{strategy}-{'killed' if kill else 'undisturbed'}"
                row = run(strategy, args, folder / name, kill)
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
