"""Could a second core hide the simulator's own cost? The loop of N replicas, with and without
the next replica's forward and backward on a second thread.

    python benchmarks/second_core.py [--replicas 256] [--machinery-us 0 400]
                                     [--switch-us 5000 50] [--steps 512]

The simulator steps one worker at a time on one thread: each worker-step is its model's
compute plus the simulator's Python (scheduling, the strategy's bookkeeping, metrics), which
for the MLP at 256 workers is 0.35-0.8 ms (docs/simulator.md, "Scale and speed"). This
times what a second core could win, without any simulation: a plain loop over N MLPs (each
with its own momentum SGD), where each step is the forward, backward and optimizer step
plus `--machinery-us` of pure Python standing in for the simulator's; and the same loop
where a second thread computes the next replica's forward and backward while the first
steps the optimizer and runs that Python. torch releases the GIL inside its kernels, so the
two overlap as far as the interpreter lets them; `--switch-us` is
`sys.setswitchinterval`, how long a thread that wants the GIL waits before it asks for it.
Each figure is the fastest of three rounds, in ms per replica-step.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.nn.functional as F

from fastsgd.workloads.models import build_model

SHAPE, CLASSES, BATCH = (1, 28, 28), 10, 32


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


class Replicas:
    def __init__(self, n: int, machinery_us: float):
        torch.manual_seed(0)
        self.models = [build_model("mlp", SHAPE, CLASSES) for _ in range(n)]
        self.optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
                           for m in self.models]
        self.x = torch.randn(64, BATCH, *SHAPE)
        self.y = torch.randint(0, CLASSES, (64, BATCH))
        self.machinery_us = machinery_us

    def gradients(self, k: int) -> None:
        model = self.models[k % len(self.models)]
        F.cross_entropy(model(self.x[k % 64]), self.y[k % 64]).backward()

    def finish(self, k: int) -> None:
        r = k % len(self.models)
        self.optimizers[r].step()
        for p in self.models[r].parameters():
            p.grad = None
        _busy(self.machinery_us)

    def serial(self, steps: int) -> float:
        start = time.perf_counter()
        for k in range(steps):
            self.gradients(k)
            self.finish(k)
        return (time.perf_counter() - start) / steps * 1e3

    def overlapped(self, steps: int, pool: ThreadPoolExecutor) -> float:
        """Replica k+1's gradients on the second thread while the first finishes step k."""
        start = time.perf_counter()
        ahead: Future = pool.submit(self.gradients, 0)
        for k in range(steps):
            ahead.result()
            if k + 1 < steps:
                ahead = pool.submit(self.gradients, k + 1)
            self.finish(k)
        return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[256])
    p.add_argument("--machinery-us", type=float, nargs="+", default=[0.0, 400.0])
    p.add_argument("--switch-us", type=float, nargs="+", default=[5000.0, 50.0])
    p.add_argument("--steps", type=int, default=512)
    args = p.parse_args()
    if min(args.replicas) < 2:
        p.error("--replicas: at least 2 (the next replica's gradients overlap this one's step)")
    torch.set_num_threads(1)
    default_switch = sys.getswitchinterval()
    print(f"{'replicas':>8} {'machinery us':>12} {'switch us':>9} {'one thread':>10} "
          f"{'two threads':>11}")
    with ThreadPoolExecutor(1) as pool:
        for n in args.replicas:
            for machinery in args.machinery_us:
                replicas = Replicas(n, machinery)
                steps = max(args.steps, 2 * n)
                for switch in args.switch_us:
                    sys.setswitchinterval(switch * 1e-6)
                    replicas.serial(steps), replicas.overlapped(steps, pool)  # warm up
                    one = min(replicas.serial(steps) for _ in range(3))
                    two = min(replicas.overlapped(steps, pool) for _ in range(3))
                    print(f"{n:8} {machinery:12.0f} {switch:9.0f} {one:10.3f} {two:11.3f}",
                          flush=True)
    sys.setswitchinterval(default_switch)


if __name__ == "__main__":
    main()
