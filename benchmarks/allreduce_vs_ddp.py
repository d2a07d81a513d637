"""fastsgd's synchronous all-reduce against torch DistributedDataParallel, in one run.

Same model, data, global batch and 4 gloo processes on this machine. Each round times
`--steps` steps of DDP, then `--steps` steps of fastsgd (the order alternates every round,
so drift in machine load hits both alike); the ratio of the median step times is printed.

    python benchmarks/allreduce_vs_ddp.py [--workers 4] [--model lenet] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from fastsgd import Replica
from fastsgd.launch.local import launch
from fastsgd.strategies import AllReduce
from fastsgd.transport.torch_dist import TorchTransport
from fastsgd.workloads.data import Shard, load_dataset
from fastsgd.workloads.models import build_model


def _setup(args, dataset, transport, wrap):
    torch.manual_seed(0)
    model = build_model(args.model, dataset.input_shape, dataset.num_classes)
    sync = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    shard = Shard(dataset.train_x, dataset.train_y, args.batch, transport.rank,
                  transport.world_size, seed=0)
    return model, sync, opt, shard


def _timed_steps(args, transport, model, sync, opt, shard, start: int) -> float:
    transport.barrier()
    t0 = time.perf_counter()
    for k in range(start, start + args.steps):
        x, y = shard.batch(k)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if sync is not None:
            sync.sync_gradients()
        opt.step()
    transport.barrier()
    return (time.perf_counter() - t0) / args.steps


def worker(args, dataset) -> None:
    transport = TorchTransport("gloo")
    ddp = _setup(args, dataset, transport, lambda m: None)
    ddp = (DistributedDataParallel(ddp[0], bucket_cap_mb=args.bucket_mb), *ddp[1:])
    ours = _setup(args, dataset, transport,
                  lambda m: Replica(m, transport, AllReduce(bucket_mb=args.bucket_mb)))
    times: dict[str, list[float]] = {"ddp": [], "fastsgd": []}
    for r in range(args.rounds + 1):  # round 0 warms up both
        order = [("ddp", ddp), ("fastsgd", ours)][:: 1 if r % 2 else -1]
        for name, (model, sync, opt, shard) in order:
            times[name].append(_timed_steps(args, transport, model, sync, opt, shard,
                                            r * args.steps))
        if r == 0:  # same init, same batches: the two must agree (later, rounding compounds)
            drift = _max_difference(ddp[0].module, ours[0])
    if transport.rank == 0:
        _report(args, {k: v[1:] for k, v in times.items()}, drift)
    transport.close()


def _max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    with torch.no_grad():
        return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def _report(args, times, drift: float) -> None:
    ddp_ms, our_ms = (statistics.median(times[k]) * 1e3 for k in ("ddp", "fastsgd"))
    print(json.dumps({"workers": args.workers, "model": args.model, "batch_per_worker":
                      args.batch, "steps_per_round": args.steps, "rounds": args.rounds,
                      "ddp_ms_per_step": round(ddp_ms, 3), "fastsgd_ms_per_step":
                      round(our_ms, 3), "ratio_fastsgd_over_ddp": round(our_ms / ddp_ms, 4),
                      "max_param_difference_after_warmup": drift}))
    print(f"step time fastsgd/DDP = {our_ms / ddp_ms:.3f}  "
          f"(fastsgd {our_ms:.2f} ms, DDP {ddp_ms:.2f} ms, median of {args.rounds} rounds)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--model", default="lenet")
    p.add_argument("--data", default="fashion_mnist")
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--steps", type=int, default=100, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    args = p.parse_args()
    dataset = load_dataset(args.data)
    launch(lambda: worker(args, dataset), args.workers)


if __name__ == "__main__":
    main()
