"""How many epochs plain large-batch SGD needs to reach a target: the question behind
experiments/scaling_long.toml (allreduce over n workers of batch 32 is SGD on batch 32n).

    python3 benchmarks/large_batch.py --batch 8192 32768 --epochs 60 [--lr 0.05]
        [--rule none|linear|sqrt] [--warmup 2]

One process, one thread, MLP on Fashion-MNIST, SGD momentum 0.9, seed 0; the rate is `lr`
times the rule's factor of batch/32, ramped up linearly over `warmup` epochs. Prints the
test accuracy after each epoch and the first epoch at or above --target.
"""

from __future__ import annotations

import argparse
import math

import torch

from fastsgd.workloads.data import load_dataset
from fastsgd.workloads.models import build_model


def train(data, batch: int, lr: float, epochs: int, warmup: float, target: float) -> None:
    torch.manual_seed(0)
    model = build_model("mlp", tuple(data.train_x.shape[1:]), data.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    n = len(data.train_y)
    per_epoch = n // batch
    ramp, step, first = warmup * per_epoch, 0, None
    for epoch in range(1, epochs + 1):
        order = torch.randperm(n)
        for i in range(per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            for group in optimizer.param_groups:
                group["lr"] = lr * min(1.0, (step + 1) / ramp) if ramp else lr
            loss = torch.nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
        with torch.no_grad():
            accuracy = (model(data.test_x).argmax(1) == data.test_y).float().mean().item()
        if first is None and accuracy >= target:
            first = epoch
        print(f"batch {batch} lr {lr:g} epoch {epoch} ({step} steps): {accuracy:.2%}", flush=True)
    print(f"batch {batch} lr {lr:g}: first at {target:.0%} after epoch {first}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--lr", type=float, default=0.05, help="the rate at batch 32")
    p.add_argument("--rule", choices=("none", "linear", "sqrt"), default="none")
    p.add_argument("--warmup", type=float, default=0.0, help="epochs")
    p.add_argument("--target", type=float, default=0.80)
    args = p.parse_args()
    torch.set_num_threads(1)
    data = load_dataset("fashion_mnist")
    for batch in args.batch:
        k = batch / 32
        factor = {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[args.rule]
        train(data, batch, args.lr * factor, args.epochs, args.warmup, args.target)


if __name__ == "__main__":
    main()
