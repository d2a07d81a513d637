"""Small runs shared by the strategy tests."""

import torch

import fastsgd as fs

# simulated tests charge fixed compute times: their outcome does not depend on machine load
FIXED_COMPUTE = {"compute.model": "fixed", "compute.step_time": "3ms", "compute.update": "200us"}


def sim_job(dataset, out, strategy: dict, steps=50, batch=16, compressor=None, model="mlp",
            **options):
    settings = {"run.steps": steps, "data.batch_size": batch, "optimizer.lr": 0.05,
                "optimizer.momentum": 0.9, "run.out": str(out), "run.eval_every": 0,
                **FIXED_COMPUTE,
                **{f"strategy.{k}": v for k, v in strategy.items()}, **options}
    return fs.Job(model=model, data=dataset, options=settings, quiet=True,
                  compressor=compressor)


def params(result) -> dict:
    return torch.load(result.run_dir / "model.pt", weights_only=True)
