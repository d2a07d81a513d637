"""The profile's strategy round (compute.strategy): it runs on the tensors the step has just
written, as a real worker's does, and leaves the model's forward, backward and parameters
to the profile."""

import torch

from fastsgd import Job
from fastsgd.loop.profiling import _steps
from fastsgd.strategies.allreduce import AllReduce
from fastsgd.strategies.averaging import LocalSGD

SEEN: list = []  # per round of Watched: each parameter's address and values
FIRED: list = []  # buckets whose overlap hook fired in Overlapping


class Watched(LocalSGD):
    """localsgd that notes, at each round, where its parameters live and what they hold."""

    name = "localsgd"

    def on_parameters(self, params, state, ctx) -> None:  # noqa: ANN001
        SEEN.append([(p.data_ptr(), p.detach().clone()) for p in params])
        super().on_parameters(params, state, ctx)


class Overlapping(AllReduce):
    name = "allreduce"

    def _ready(self, bucket, ctx) -> None:  # noqa: ANN001
        FIRED.append(bucket)
        super()._ready(bucket, ctx)


def _plan(strategy, tmp_path):
    job = Job(model="mlp", data="digits", strategy=strategy, quiet=True,
              options={"run.workers": 2, "run.steps": 4, "run.out": str(tmp_path)})
    return job.plan(job.config, simulated=True)


def test_the_round_runs_on_the_tensors_the_step_wrote(tmp_path):
    plan = _plan(Watched(period=1), tmp_path)
    SEEN.clear()
    torch.manual_seed(plan.config["run"]["seed"])  # as the profile makes its model
    start = [p.detach().clone() for p in plan.make_model().parameters()]
    samples, model = _steps(plan, warmup=1, repeat=3)
    assert len(samples["strategy"]) == 3
    pointers = [p.data_ptr() for p in model.parameters()]
    rounds = SEEN[1:]  # the first is the profile's trial round
    assert len(rounds) == 4
    for seen in rounds:
        assert [ptr for ptr, _ in seen] == pointers
        assert not all(torch.equal(v, s) for (_, v), s in zip(seen, start))  # a step's values
    # each round's parameters are one step from the start: the profile puts them back
    assert all(torch.equal(p, s) for p, s in zip(model.parameters(), start))


def test_the_strategy_s_hooks_stay_off_the_model_s_backward(tmp_path):
    FIRED.clear()
    plan = _plan(Overlapping(overlap=True), tmp_path)
    _steps(plan, warmup=1, repeat=2)
    assert FIRED == []
