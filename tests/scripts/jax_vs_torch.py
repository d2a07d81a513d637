"""Runs of the MLP of examples/jax_mlp.py, in JAX or in PyTorch, from the same initial
parameters, one per strategy; prints each one's accuracy (the mean of its last three
evaluations) as JSON.

    python tests/scripts/jax_vs_torch.py jax|torch run|simulate STEPS WORKERS OUT STRATEGY...
        [--schedule=NAME]

The learning rate is constant unless --schedule names an optimizer.schedule (e.g. cosine).
jax|torch may also be a list, torch,jax: each framework in turn, in this process (one
start-up), in OUT/FRAMEWORK, printed as {framework: {strategy: accuracy}}.

A process of its own: forked workers need a process that has not run JAX yet (a real run
after a simulated JAX one is refused).
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
    schedule = [a for a in sys.argv[1:] if a.startswith("--schedule=")]
    frameworks, mode, steps, workers, out, *strategies = (
        a for a in sys.argv[1:] if a not in schedule)
    options = {"optimizer.schedule": schedule[-1].split("=", 1)[1]} if schedule else {}
    if "," not in frameworks:
        print(json.dumps(accuracies(frameworks, mode, int(steps), int(workers), out,
                                    strategies, options)))
        return
    print(json.dumps({framework: accuracies(framework, mode, int(steps), int(workers),
                                            f"{out}/{framework}", strategies, options)
                      for framework in frameworks.split(",")}))


def accuracies(framework: str, mode: str, steps: int, workers: int, out: str,
               strategies: list[str], options: dict) -> dict[str, float]:
    """{strategy: accuracy} of `framework`'s MLP, each strategy's run in OUT/STRATEGY."""
    if framework == "jax":
        import jax_mlp

        from fastsgd.frameworks import jax as fj

        model = fj.Model(torch_mlp_params(), jax_mlp.apply, jax_mlp.loss)
    else:
        model = "mlp"
    accuracy = {}
    for strategy in strategies:
        settings = {"run.workers": workers, "run.steps": steps, "run.seed": SEED,
                    "run.eval_every": steps // 6, "strategy.name": strategy,
                    "run.out": f"{out}/{strategy}", "compute.model": "fixed",
                    "compute.step_time": "5ms", **options}
        job = fs.Job(model=model, data="fashion_mnist", options=settings, quiet=True)
        result = job.simulate() if mode == "simulate" else job.run()
        last = [e["accuracy"] for e in result.evals()][-3:]
        accuracy[strategy] = sum(last) / len(last)
    return accuracy


if __name__ == "__main__":
    main()
