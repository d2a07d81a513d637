"""Does where the profile runs a strategy's round change what it costs? (issue 51, item 2)

    python -m benchmarks.round_cache [--width 256] [--rounds 20]

A real worker's round runs on the parameters its optimizer step has just written.
`compute.model = "profile"` runs it on those very tensors too, through a twin of the model
that shares them (loop/profiling.py, `_sharing`), so that the strategy's hooks stay off the
model whose forward and backward it times; until then it gave a twin a copy of the step's
parameters and gradients. This times localsgd's round (an average over one worker:
flatten, divide, copy back) on the GPT with AdamW, one thread, alternating: on the model,
on the sharing twin, on a twin given a copy, and on a twin left as its last round left it;
it prints the median of each.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

from fastsgd.loop.profiling import _Alone, _sharing
from fastsgd.loop.replica import Replica
from fastsgd.records.rundir import cpu_name
from fastsgd.strategies.averaging import LocalSGD
from fastsgd.workloads.gpt import GPT


def timed_round(replica: Replica) -> float:
    start = time.perf_counter()
    replica.ctx.step = 0
    replica.sync_gradients()
    replica.sync_parameters()
    return time.perf_counter() - start


def copy_into(twin: torch.nn.Module, model: torch.nn.Module) -> None:
    """`model`'s parameters and gradients, into `twin`'s tensors (the profile's old way)."""
    with torch.no_grad():
        for mine, theirs in zip(twin.parameters(), model.parameters()):
            mine.copy_(theirs)
            mine.grad = theirs.grad.clone()


def given_grads(twin: torch.nn.Module, model: torch.nn.Module) -> None:
    for mine, theirs in zip(twin.parameters(), model.parameters()):
        mine.grad = theirs.grad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)  # as the profile and a worker process compute
    torch.manual_seed(0)
    model = GPT(256, 128, 4, 4, args.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    twin, sharing = copy.deepcopy(model), _sharing(model)
    on_twin = Replica(twin, _Alone(), LocalSGD(period=1), total_steps=1)
    on_sharing = Replica(sharing, _Alone(), LocalSGD(period=1), total_steps=1)
    on_model = Replica(model, _Alone(), LocalSGD(period=1), total_steps=1)
    tokens = torch.randint(0, 256, (32, 129))

    def step() -> None:
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, 256),
                                          tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()

    ways: dict[str, Callable[[], float]] = {
        "on the model, right after its step (a real worker's way)":
            lambda: timed_round(on_model),
        "on a twin sharing the model's tensors (the profile's way)":
            lambda: (given_grads(sharing, model), timed_round(on_sharing))[1],
        "on a twin given a copy of the step's parameters and gradients":
            lambda: (copy_into(twin, model), timed_round(on_twin))[1],
        "on a twin untouched since its last round": lambda: timed_round(on_twin)}
    times: dict[str, list[float]] = {way: [] for way in ways}
    for k in range(3 + args.rounds):  # three rounds of warm-up
        for way, round_ in ways.items():
            step()
            took = round_()
            if k >= 3:
                times[way].append(took)
    print(f"gpt width {args.width}, localsgd's round, median of {args.rounds}; "
          f"machine: {cpu_name()}")
    for way, seconds in times.items():
        print(f"{statistics.median(seconds) * 1e3:6.2f} ms  {way}")


if __name__ == "__main__":
    main()
