"""The profile's strategy round (compute.strategy): it runs on the tensors the step has just
written, as a real worker's does, and leaves the model's forward, backward and parameters
to the profile."""

import json

import pytest
import torch

from fastsgd import Job
from fastsgd.config import schema as cfg
from fastsgd.loop.profiling import _difference, _steps, fingerprint
from fastsgd.strategies import CHOICES
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


def _small(tmp_path, **options):
    """A small simulated job's plan (digits, an MLP, 2 workers, 4 steps)."""
    job = Job(model="mlp", data="digits", quiet=True,
              options={"run.workers": 2, "run.steps": 4, "run.eval_every": 0,
                       "data.batch_size": 8, "run.out": str(tmp_path), **options})
    return job.plan(job.config, simulated=True)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_profile_times_the_workers_micro_batches(tmp_path, precision):
    """run.accumulate = 2: each step is two forward and backward passes of data.batch_size
    (under run.precision's autocast), then one update, as a worker's step
    (loop/kit/accumulate.py); not one pass over the two micro-batches at once."""
    plan = _small(tmp_path, **{"run.accumulate": 2, "run.precision": precision})
    seen, updates = [], []
    inner, make = plan.step, plan.make_optimizer

    def step(model, batch):  # noqa: ANN001, ANN202
        seen.append((len(batch[0]), torch.is_autocast_enabled("cpu")))
        return inner(model, batch)

    def optimizer(params):  # noqa: ANN001, ANN202
        made = make(params)
        made.register_step_post_hook(lambda *_: updates.append(1))
        return made
    plan.step, plan.make_optimizer = step, optimizer
    samples, _ = _steps(plan, warmup=1, repeat=2)
    assert seen == [(8, precision == "bf16")] * 6 and len(updates) == 3
    assert all(len(samples[phase]) == 2 for phase in ("forward", "backward", "update"))


def test_the_fingerprint_holds_what_the_workers_compute(tmp_path):
    """run.accumulate, run.precision and model.heads change the times: a config.toml whose
    times were measured without them profiles again."""
    plan = _small(tmp_path)
    written = fingerprint(plan)
    assert (written["run.accumulate"], written["run.precision"], written["model.heads"]) == (
        1, "fp32", 4)
    for key, value in (("run.accumulate", 4), ("run.precision", "bf16"), ("model.heads", 2)):
        section, name = key.split(".")
        plan.config = cfg.merged(plan.config, CHOICES, **{section: {name: value}})
        assert _difference(written, fingerprint(plan)).startswith(key)
        plan.config = cfg.merged(plan.config, CHOICES, **{section: {name: written[key]}})
    # profiled before these keys were: it was measured with their defaults (one pass of
    # data.batch_size, no autocast), so it is kept where the run has them
    old = {k: v for k, v in written.items() if k not in ("run.accumulate", "run.precision",
                                                         "model.heads")}
    assert _difference(old, fingerprint(plan)) is None
    plan.config = cfg.merged(plan.config, CHOICES, run={"accumulate": 4})
    assert _difference(old, fingerprint(plan)) == "run.accumulate = 1, this run has 4"


def test_another_accumulate_profiles_again(tmp_path, capsys):
    """`fastsgd simulate OLD/config.toml --set run.accumulate=4` measures the 4 micro-batches
    (it charged the 1 micro-batch's times: 4x the samples a second, at no cost)."""
    first = Job(config=None, quiet=True, options={
        "model.name": "mlp", "data.name": "digits", "run.workers": 2, "run.steps": 4,
        "run.eval_every": 0, "data.batch_size": 8, "run.out": str(tmp_path / "a")}).simulate()
    capsys.readouterr()
    again = Job(config=first.run_dir / "config.toml", quiet=True, options={
        "run.accumulate": 4, "run.out": str(tmp_path / "b")}).simulate()
    assert ("the times were measured for run.accumulate = 1, this run has 4; profiling again"
            in capsys.readouterr().err)
    compute = cfg.load(CHOICES, again.run_dir / "config.toml")["compute"]
    assert compute["profiled"]["run.accumulate"] == 4


@pytest.mark.parametrize("accumulate", [1, 3])
def test_fixed_times_are_a_whole_optimizer_step_s(tmp_path, accumulate):
    """compute.step_time (and forward, backward) under fixed are what profile measures: the
    forward and backward of one optimizer step, all its run.accumulate micro-batches, charged
    once a step whatever run.accumulate is (set them for the step's work, as for
    data.batch_size)."""
    result = Job(quiet=True, options={
        "model.name": "mlp", "data.name": "digits", "run.workers": 2, "run.steps": 3,
        "run.eval_every": 0, "data.batch_size": 8, "run.accumulate": accumulate,
        "compute.model": "fixed", "compute.step_time": "3ms",
        "run.out": str(tmp_path / "run")}).simulate()
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    assert {round(m["forward"] + m["backward"], 9) for m in lines if "forward" in m} == {0.003}
