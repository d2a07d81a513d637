"""What fastsgd costs on one process: a step of the GPT under `allreduce` with one worker
against the same step in a plain PyTorch loop (same model, batches, optimizer, precision).

    python benchmarks/gpt_overhead.py [--steps 60] [--device cpu|cuda] [--precision bf16]

Both on one intra-op thread on a CPU (what a worker of fastsgd run uses); the median step
time over the steps after the first ten. Prints one line per side and their ratio (issue
49 asks for at most 1.05).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import fastsgd as fs
from fastsgd.loop.language import next_token_step
from fastsgd.workloads.data import Shard, load_dataset
from fastsgd.workloads.gpt import GPT

WARMUP = 10
SIZE = {"layers": 4, "heads": 4, "width": 128, "context": 128}
BATCH, LR = 32, 1e-3


def plain(steps: int, device: str, precision: str) -> float:
    """The median seconds of a step of a hand-written loop."""
    torch.manual_seed(0)
    data = load_dataset("text", context=SIZE["context"])
    model = GPT(data.num_classes, **SIZE).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    shard = Shard(data.train_x, data.train_y, BATCH, 0, 1, seed=0, tokens=data.train_tokens)
    times = []
    for k in range(steps):
        start = time.perf_counter()
        x, y = shard.batch(k)
        with torch.autocast(device, torch.bfloat16, enabled=precision == "bf16"):
            loss = next_token_step(model, (x.to(device), y.to(device)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[WARMUP:])


def under_fastsgd(steps: int, device: str, precision: str) -> float:
    """The median seconds between consecutive steps of a one-worker allreduce run."""
    with tempfile.TemporaryDirectory() as out:
        options = {**{f"model.{k}": v for k, v in SIZE.items()}, "model.name": "gpt",
                   "data.name": "text", "data.batch_size": BATCH, "optimizer.name": "adamw",
                   "optimizer.lr": LR, "run.steps": steps, "run.eval_every": 0,
                   "run.precision": precision, "run.tensorboard": False, "run.out": out,
                   "run.backend": "nccl" if device == "cuda" else "gloo"}
        fs.Job(strategy="allreduce", options=options, quiet=True).run(workers=1)
        lines = [json.loads(s) for s in (Path(out) / "metrics.jsonl").open()]
    clock = [line["time"] for line in lines if line.get("rank") == 0]
    return statistics.median(b - a for a, b in zip(clock[WARMUP:], clock[WARMUP + 1:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # as a worker process runs
    ours = under_fastsgd(args.steps, args.device, args.precision)  # first: it forks
    base = plain(args.steps, args.device, args.precision)
    print(f"gpt {SIZE}, batch {BATCH}, {args.device}, {args.precision}")
    print(f"plain PyTorch loop  {base * 1e3:8.1f} ms/step")
    print(f"fastsgd allreduce   {ours * 1e3:8.1f} ms/step")
    print(f"ratio               {ours / base:8.3f}")


if __name__ == "__main__":
    main()
