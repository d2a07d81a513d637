"""Small runs shared by the strategy tests."""

import pytest
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


def assert_resumes_bitwise(workers: int, replica, steps, total: int = 12) -> None:
    """`total` steps straight equal half of them, a save and load of model, optimizer and
    replica state into fresh objects, and the other half: bitwise, on every worker.
    `replica(t)` builds (model, optimizer, Replica); `steps(t, model, optimizer, replica,
    first, last)` trains steps [first, last)."""
    import io

    from fastsgd.transport.sim import simulate

    def straight(t):
        model, optimizer, rep = replica(t)
        steps(t, model, optimizer, rep, 0, total)
        return [p.detach().clone() for p in model.parameters()]

    def resumed(t):
        model, optimizer, rep = replica(t)
        steps(t, model, optimizer, rep, 0, total // 2)
        file = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "replica": rep.state_dict()}, file)
        file.seek(0)
        saved = torch.load(file, weights_only=True)
        model, optimizer, rep = replica(t)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        rep.load_state_dict(saved["replica"])
        steps(t, model, optimizer, rep, total // 2, total)
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(simulate(workers, straight), simulate(workers, resumed)):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def refused_in_one_line(run, message: str) -> None:
    """`run()` ends in a UserError matching `message`, in one line."""
    with pytest.raises(fs.UserError, match=message) as caught:
        run()
    assert "\n" not in str(caught.value)
