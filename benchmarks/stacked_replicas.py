"""Does computing many replicas together pay on this CPU? (docs/simulator.md, "Scale and speed")

    python benchmarks/stacked_replicas.py [--replicas 16 256] [--models mlp lenet]
                                          [--repeats 5] [--json]

The simulator steps each logical worker's replica on its own. Issue 10 suggested stacking
them: one call for all replicas' forward, backward and update. For each model (batch 32 of
Fashion-MNIST-sized inputs, SGD lr 0.05 momentum 0.9, one intra-op thread) and number of
replicas N this times, per replica-step, in ms:

- bare: one model, forward + backward + `optimizer.step()` in a plain loop (the yardstick of
  benchmarks/sim_scale.py);
- loop: N models, one after the other (what the simulator computes, without the simulation);
- vmap_grad: `torch.func.vmap(torch.func.grad(loss))` over parameters stacked N deep, then
  one momentum update of the stacks (its gradients are checked against each replica's own
  first);
- stacked_allreduce: vmap_grad whose update takes the stacks' mean gradient (over the
  replicas), as a synchronous all-reduce gives every worker: the whole step of a simulator
  that held its workers as stacks, without its bookkeeping;
- stacked_gossip: vmap_grad, then each replica's parameters averaged with the next one's (a
  one-peer gossip round, as dpsgd on the one-peer graph mixes);
- vmap_restack: the replicas kept apart, as the simulator keeps its workers: their
  parameters stacked for each step, `vmap(grad)`, each replica handed its gradients (views)
  and stepped by its own optimizer;
- vmap_autograd: `vmap(functional_call)` forward of the stacks, one backward through it;
- bmm (MLP only): the same network written by hand with batched matrix products.

Prints the machine and a Markdown table (or JSON); each figure is the median of --repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from common import cpu_name
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from fastsgd.workloads.models import build_model

BATCH, SHAPE, CLASSES, LR, MOMENTUM = 32, (1, 28, 28), 10, 0.05, 0.9


def _per_step(fn, steps: int, repeats: int) -> float:
    """Median ms of `fn()` over `repeats` timings, divided by the replica-steps it does."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3 / steps


def _sgd(params: dict, grads: dict, moments: dict) -> None:
    with torch.no_grad():
        for name, g in grads.items():
            moments[name].mul_(MOMENTUM).add_(g)
            params[name].sub_(moments[name], alpha=LR)


def measure(model: str, n: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    models = [build_model(model, SHAPE, CLASSES) for _ in range(n)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM) for m in models]
    x, y = torch.randn(n, BATCH, *SHAPE), torch.randint(0, CLASSES, (n, BATCH))
    loss = nn.CrossEntropyLoss()

    def one(i: int) -> None:
        optimizers[i].zero_grad()
        loss(models[i](x[i]), y[i]).backward()
        optimizers[i].step()

    def loop() -> None:
        for i in range(n):
            one(i)

    figures = {"bare": _per_step(lambda: [one(0) for _ in range(20)], 20, repeats),
               "loop": _per_step(loop, n, repeats)}
    base = build_model(model, SHAPE, CLASSES)
    params, _ = stack_module_state(models)
    params = {k: v.detach().clone() for k, v in params.items()}
    moments = {k: torch.zeros_like(v) for k, v in params.items()}

    def batch_loss(p, xi, yi):
        return loss(functional_call(base, p, (xi,)), yi)

    grads_of = vmap(grad(batch_loss))
    _check_same(models, optimizers, loss, grads_of(params, x, y), x, y)
    figures["vmap_grad"] = _per_step(lambda: _sgd(params, grads_of(params, x, y), moments),
                                     n, repeats)

    def allreduce_step() -> None:  # the mean over the replicas (dim 0) as every one's gradient
        _sgd(params, {k: g.mean(0, keepdim=True) for k, g in grads_of(params, x, y).items()},
             moments)

    def gossip_step() -> None:  # each its own update, then the average with one peer's
        _sgd(params, grads_of(params, x, y), moments)
        with torch.no_grad():
            for v in params.values():
                v.add_(v.roll(1, 0)).mul_(0.5)

    figures["stacked_allreduce"] = _per_step(allreduce_step, n, repeats)
    figures["stacked_gossip"] = _per_step(gossip_step, n, repeats)

    named = [dict(m.named_parameters()) for m in models]

    def restacked_step() -> None:  # the replicas kept apart, stacked for each step only
        grads = grads_of({k: torch.stack([ps[k].detach() for ps in named]) for k in params},
                         x, y)
        for i, (ps, optimizer) in enumerate(zip(named, optimizers)):
            for k, p in ps.items():
                p.grad = grads[k][i]
            optimizer.step()

    figures["vmap_restack"] = _per_step(restacked_step, n, repeats)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    forward = vmap(lambda p, xi: functional_call(base, p, (xi,)))

    def autograd_step() -> None:
        out = forward(leaves, x)
        total = nn.functional.cross_entropy(out.reshape(n * BATCH, -1), y.reshape(-1),
                                            reduction="sum") / BATCH
        for v in leaves.values():
            v.grad = None
        total.backward()
        _sgd(leaves, {k: v.grad for k, v in leaves.items()}, moments)

    figures["vmap_autograd"] = _per_step(autograd_step, n, repeats)
    if model == "mlp":
        figures["bmm"] = _per_step(lambda: _bmm_step(leaves, x, y, moments), n, repeats)
    return figures


def _check_same(models, optimizers, loss, stacked: dict, x, y) -> None:
    """The stacked gradients are each replica's own (to float rounding): else it would be
    timing something else."""
    for i in (0, len(models) - 1):
        optimizers[i].zero_grad()
        loss(models[i](x[i]), y[i]).backward()
        for name, p in models[i].named_parameters():
            torch.testing.assert_close(stacked[name][i], p.grad, rtol=1e-4, atol=1e-6)


def _bmm_step(p: dict, x: torch.Tensor, y: torch.Tensor, moments: dict) -> None:
    """The MLP (Flatten, Linear, ReLU, Linear, ReLU, Linear) by batched products."""
    w = list(p.values())
    h = x.flatten(2)
    for layer in range(3):
        h = torch.baddbmm(w[2 * layer + 1].unsqueeze(1), h, w[2 * layer].transpose(1, 2))
        h = h.relu() if layer < 2 else h
    total = nn.functional.cross_entropy(h.reshape(-1, CLASSES), y.reshape(-1),
                                        reduction="sum") / BATCH
    for v in w:
        v.grad = None
    total.backward()
    _sgd(p, {k: v.grad for k, v in p.items()}, moments)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [{"model": m, "replicas": n, **measure(m, n, args.repeats)}
            for m in args.models for n in args.replicas]
    machine = {"cpu": cpu_name(), "torch": torch.__version__, "threads": 1}
    if args.json:
        print(json.dumps({"machine": machine, "rows": rows}, indent=1))
        return 0
    print(f"{machine['cpu']}, torch {machine['torch']}, one thread; ms per replica-step "
          "(x bare)")
    columns = ["loop", "vmap_grad", "stacked_allreduce", "stacked_gossip", "vmap_restack",
               "vmap_autograd", "bmm"]
    print("| model | replicas | bare | " + " | ".join(columns) + " |")
    print("|---" * (3 + len(columns)) + "|")
    for r in rows:
        cells = [f"{r[c]:.2f} ({r[c] / r['bare']:.2f}x)" if c in r else "-" for c in columns]
        print(f"| {r['model']} | {r['replicas']} | {r['bare']:.2f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
