"""Runs of the MLP of examples/jax_mlp.py, in JAX or in PyTorch, from the same initial
parameters, one per strategy; prints each one's accuracy (the mean of its last three
evaluations) as JSON.

    python tests/scripts/jax_vs_torch.py jax|torch run|simulate STEPS WORKERS OUT STRATEGY...

A process of its own: forked workers need a process that has not run JAX yet.
"""

import json
import sys
from pathlib import Path

import torch

import fastsgd as fs
from fastsgd.workloads.models import build_model

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

SEED = 0


def torch_mlp_params() -> list[dict]:
    """The built-in mlp's initial parameters (seed SEED) as the JAX model's pytree."""
    torch.manual_seed(SEED)
    layers = [m for m in build_model("mlp", (1, 28, 28), 10) if isinstance(m, torch.nn.Linear)]
    return [{"w": m.weight.detach().T.contiguous().numpy(), "b": m.bias.detach().numpy()}
            for m in layers]


def main() -> None:
    framework, mode, steps, workers, out, *strategies = sys.argv[1:]
    if framework == "jax":
        import jax_mlp

        from fastsgd.frameworks import jax as fj

        model = fj.Model(torch_mlp_params(), jax_mlp.apply, jax_mlp.loss)
    else:
        model = "mlp"
    accuracy = {}
    for strategy in strategies:
        options = {"run.workers": int(workers), "run.steps": int(steps), "run.seed": SEED,
                   "run.eval_every": int(steps) // 6, "strategy.name": strategy,
                   "run.out": f"{out}/{strategy}", "compute.model": "fixed",
                   "compute.step_time": "5ms"}
        job = fs.Job(model=model, data="fashion_mnist", options=options, quiet=True)
        result = job.simulate() if mode == "simulate" else job.run()
        last = [e["accuracy"] for e in result.evals()][-3:]
        accuracy[strategy] = sum(last) / len(last)
    print(json.dumps(accuracy))


if __name__ == "__main__":
    main()
