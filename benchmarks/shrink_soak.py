"""Shrink soak: synchronous runs whose workers are killed (-9) at random moments; every run
must end with its survivors alike and the model of the run without a death.

    python3 benchmarks/shrink_soak.py [--runs 20] [--strategy allreduce] [--workers 4]
                                      [--steps 300] [--kills 2] [--seed 0] [--json FILE]

Each run is `fastsgd run` (the digits MLP, `run.on_failure = "shrink"`, the default); this
script kill -9s `--kills` random worker processes, each at a random moment of the run's
training (so between steps, mid-collective, mid-evaluation or during a recovery, wherever
it falls; a death during the setup restarts the run instead, which is not what this
checks). A run passes if it exits 0 with one line per death, the summary lists the dead,
the replicas end alike (consensus distance 0) and, for allreduce, the model is the
undisturbed run's to 1e-5 (large-batch SGD does not depend on how many split the batch).
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
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402
from soak import children  # noqa: E402


def run(args: argparse.Namespace, out: Path, kill_at: list[float], rng: random.Random
        ) -> dict[str, Any]:
    sets = ["data.name=digits", "model.name=mlp", f"strategy.name={args.strategy}",
            f"run.workers={args.workers}", f"run.steps={args.steps}", "run.eval_every=50",
            f"run.out={out}"]
    cmd = [sys.executable, "-m", "fastsgd", "run", "--quiet",
           *[a for s in sets for a in ("--set", s)]]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    killed, moments = [], []
    while kill_at and proc.poll() is None and not (out / "metrics.jsonl").exists():
        time.sleep(0.005)  # kills fall in training: a death in the setup restarts the run
    training = time.monotonic()
    for at in sorted(kill_at):
        while proc.poll() is None and time.monotonic() - training < at:
            time.sleep(0.005)
        workers = [pid for pid in children(proc.pid) if pid not in killed]
        if proc.poll() is None and len(workers) > 1:
            victim = rng.choice(workers)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            moments.append(time.monotonic() - training)
    _, err = proc.communicate(timeout=600)
    summary = json.loads((out / "summary.json").read_text()) if proc.returncode == 0 else {}
    return {"returncode": proc.returncode, "stderr": err.strip().splitlines(),
            "kills": len(killed), "kill_moments": moments, "summary": summary,
            "wall_s": round(time.monotonic() - began, 2)}


def check(result: dict[str, Any], reference: dict[str, torch.Tensor] | None,
          out: Path) -> list[str]:
    """What went wrong in one run (nothing: [])."""
    if result["returncode"] != 0:
        return [f"exit {result['returncode']}: {result['stderr'][-3:]}"]
    summary, problems = result["summary"], []
    # a kill as the run ends may find its worker done (no death), or come after the summary
    during = sum(m < summary["wall_time"] - 0.1 for m in result["kill_moments"])
    if not during <= len(summary["lost_workers"]) <= result["kills"]:
        problems.append(f"{result['kills']} killed ({during} in training), "
                        f"{len(summary['lost_workers'])} listed")
    if not during <= len(result["stderr"]) <= result["kills"]:
        problems.append(f"stderr: {result['stderr']}")
    if summary["consensus_distance"] != 0:
        problems.append(f"consensus {summary['consensus_distance']}")
    if reference is not None:
        model = torch.load(out / "model.pt", weights_only=True)
        gap = max(float((reference[k] - model[k]).abs().max()) for k in reference)
        if gap > 1e-5:
            problems.append(f"model differs from the undisturbed run's by {gap:.3g}")
    return problems


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--strategy", default="allreduce")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        straight = run(args, Path(tmp) / "straight", [], rng)
        assert straight["returncode"] == 0, straight["stderr"]
        length = straight["summary"]["wall_time"]  # of training
        reference = (torch.load(Path(tmp) / "straight" / "model.pt", weights_only=True)
                     if args.strategy == "allreduce" else None)
        results = []
        for i in range(args.runs):
            out = Path(tmp) / f"run{i}"
            moments = [rng.uniform(0.05, 0.8) * length for _ in range(args.kills)]
            result = run(args, out, moments, rng)
            result["problems"] = check(result, reference, out)
            results.append(result)
            print(f"run {i}: {result['kills']} killed, {result['wall_s']} s, "
                  f"{'ok' if not result['problems'] else result['problems']}", flush=True)
    failed = sum(bool(r["problems"]) for r in results)
    print(f"\n{cpu_name()}, {args.strategy}, {args.workers} workers, {args.steps} steps: "
          f"{args.runs - failed} of {args.runs} runs passed (undisturbed: {length:.1f} s of "
          "training)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
