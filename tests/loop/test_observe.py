"""Watching a run: what the user's evaluate returns is checked in one place; the default
evaluate takes any floating dtype; evaluating and scoring replicas leave training as it was
(docs/simulator.md, "Observation is free")."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fastsgd as fs
from fastsgd.config.objects import import_path
from fastsgd.errors import UserError
from fastsgd.loop.plan import Evaluation, Plan, cross_entropy_step, evaluate_classifier

SMALL = {"run.steps": 3, "run.workers": 2, "data.name": "synthetic", "model.name": "mlp",
         "compute.model": "fixed", "compute.step_time": "1ms"}  # simulated times repeat
CPU = torch.device("cpu")


def _run(tmp_path, name, real=False, **kwargs):
    options = {**SMALL, **kwargs.pop("options", {}), "run.out": str(tmp_path / name)}
    job = fs.Job(options=options, quiet=True, **kwargs)
    return job.run() if real else job.simulate()


def _strict(path):
    """JSON as any reader takes it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{path.name} holds {constant}")
    return json.loads(path.read_text(), parse_constant=refuse)


# --- what evaluate returns ---------------------------------------------------------------

def _returns_a_dict(model, dataset, device):
    return {"accuracy": 0.5, "loss": 1.0}


def _message(fn, what):
    return (f"model.evaluate ({import_path(fn)}) returned {what}; it must return "
            "(accuracy, loss), two numbers")


@pytest.mark.parametrize("returned, what", [
    (None, "None"), (0.5, "a float"), ((0.5, 1.0, 2.0), "a tuple of 3 values"),
    ({"accuracy": 0.5, "loss": 1.0}, "a dict"), (("0.5", 1.0), "(a str, a float)"),
    ((torch.tensor([0.5, 0.6]), 1.0), "(a tensor of shape (2,), a float)")])
def test_a_wrong_result_of_evaluate_is_one_line_naming_the_function(returned, what):
    def evaluate(model, dataset, device):
        return returned
    with pytest.raises(UserError) as e:
        Evaluation(evaluate)(nn.Linear(2, 2), None, CPU)
    assert str(e.value) == _message(evaluate, what)


@pytest.mark.parametrize("returned", [
    (torch.tensor(0.5), torch.tensor(1.0)), (np.float32(0.5), np.float64(1.0)), [0.5, 1]])
def test_numbers_of_any_kind_come_back_as_floats(returned):
    accuracy, loss = Evaluation(lambda m, d, dev: returned)(nn.Linear(2, 2), None, CPU)
    assert (accuracy, loss) == (0.5, 1.0)
    assert type(accuracy) is float and type(loss) is float


def test_a_simulated_run_stops_at_a_wrong_result_in_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        _run(tmp_path, "dict", evaluate=_returns_a_dict)
    assert str(e.value) == _message(_returns_a_dict, "a dict")


@pytest.mark.multiproc
def test_a_real_run_stops_at_a_wrong_result_in_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        _run(tmp_path, "dict", real=True, evaluate=_returns_a_dict)
    assert str(e.value) == _message(_returns_a_dict, "a dict")


def _tensors(model, dataset, device):
    return torch.tensor(0.25), np.float32(1.5)


def test_tensors_and_numpy_scalars_reach_eval_jsonl_and_the_summary(tmp_path):
    result = _run(tmp_path, "tensors", evaluate=_tensors)
    assert [(r["accuracy"], r["loss"]) for r in result.evals()] == [(0.25, 1.5)]
    assert (result.summary["final_accuracy"], result.summary["final_loss"]) == (0.25, 1.5)


def _diverged(model, dataset, device):
    return 0.1, float("nan")


def test_a_nan_loss_keeps_the_run_going_and_summary_json_valid(tmp_path):
    result = _run(tmp_path, "nan", evaluate=_diverged, options={"run.eval_every": 1})
    summary = _strict(result.run_dir / "summary.json")
    assert summary["final_accuracy"] == 0.1 and summary["final_loss"] is None
    losses = [r["loss"] for r in result.evals()]  # as metrics.jsonl keeps a NaN loss
    assert len(losses) == 3 and all(math.isnan(v) for v in losses)


def _lost(model, dataset, device):
    return float("nan"), float("nan")


def test_the_reports_show_what_a_diverged_run_lacks(tmp_path, capsys):
    from fastsgd.cli.main import main
    run = tmp_path / "lost"
    assert main(["simulate", "--no-report", *[f"--set={k}={v}" for k, v in SMALL.items()],
                 "--set", "model.evaluate=tests.loop.test_observe:_lost",
                 "--set", f"run.out={run}"]) == 0
    assert "test accuracy  n/a   (loss n/a)" in capsys.readouterr().out
    assert main(["report", str(run), str(run), "--out", str(tmp_path / "report")]) == 0
    assert "| lost | allreduce / none | 2 |  |" in (tmp_path / "report" / "report.md").read_text()


# --- the default evaluate ------------------------------------------------------------------

def _mlp(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(),
                         nn.Linear(16, 10)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_the_default_evaluate_takes_a_model_of_any_floating_dtype(synthetic, dtype):
    accuracy, loss = evaluate_classifier(_mlp(dtype), synthetic, CPU)
    reference, expected = evaluate_classifier(_mlp(torch.float32), synthetic, CPU)
    assert 0 <= accuracy <= 1 and math.isfinite(loss)
    if dtype == torch.float64:
        assert accuracy == reference and loss == pytest.approx(expected, rel=1e-5)


class Float64(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _mlp(torch.float64)

    def forward(self, x):
        return self.net(x)


def test_a_float64_model_trains_and_is_evaluated_by_default(tmp_path):
    result = _run(tmp_path, "f64", model=Float64)
    assert 0 <= result.summary["final_accuracy"] <= 1


class WithAux(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _mlp(torch.float32)

    def forward(self, x):
        logits = self.net(x)
        return logits, logits.square().mean()


def _aux_step(model, batch):
    logits, aux = model(batch[0])
    return F.cross_entropy(logits, batch[1]) + 0.01 * aux


NOT_LOGITS = ("the default evaluate needs a model returning logits of shape (N, classes); "
              "this one returned {}: pass evaluate=")


def test_a_model_not_returning_logits_fails_the_default_evaluate_in_one_line(tmp_path,
                                                                            synthetic):
    with pytest.raises(UserError) as e:
        _run(tmp_path, "aux", model=WithAux, step=_aux_step)
    assert str(e.value) == NOT_LOGITS.format("a tuple")
    with pytest.raises(UserError) as e:
        evaluate_classifier(nn.Sequential(nn.Flatten(), nn.Linear(64, 1), nn.Flatten(0)),
                            synthetic, CPU)
    assert str(e.value) == NOT_LOGITS.format("a tensor of shape (512,)")


# --- evaluating and scoring leave training as it was ---------------------------------------

class Normalized(nn.Module):
    """BatchNorm and dropout: an evaluation or a score in train mode would move the
    running statistics and draw from training's random numbers."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32),
                                 nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


def _leaves_eval_mode(model, dataset, device):
    model.eval()
    return evaluate_classifier(model, dataset, device)


def _in_train_mode(model, dataset, device):
    """Forgets model.eval(): BatchNorm's statistics move, dropout draws random numbers."""
    with torch.no_grad():
        loss = F.cross_entropy(model(dataset.test_x), dataset.test_y)
    return 0.5, float(loss)


def _training(result):
    """What training did: every worker's loss at every step, the model kept."""
    rows = [(r["step"], r["rank"], r["loss"], r["time"]) for r in result.metrics()]
    return sorted(rows), torch.load(result.run_dir / "model.pt")


def _same(a, b):
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys()
    assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])


@pytest.mark.parametrize("policy, evaluate", [
    ("best", None), ("average", None), ("rank0", None), ("rank0", _in_train_mode),
    ("best", _leaves_eval_mode)])
def test_simulated_training_is_bitwise_the_same_with_and_without_evaluations(
        tmp_path, policy, evaluate):
    options = {"run.steps": 4, "run.representative": policy, "run.log_every": 1}
    watched = _run(tmp_path, "every", model=Normalized, evaluate=evaluate,
                   options={**options, "run.eval_every": 1})
    once = _run(tmp_path, "once", model=Normalized, evaluate=evaluate,
                options={**options, "run.eval_every": 0})
    assert len(watched.evals()) == 4 and len(once.evals()) == 1
    _same(_training(watched), _training(once))
    assert int(_training(watched)[1]["net.2.num_batches_tracked"]) == 4


def test_a_score_changes_nothing_and_is_the_eval_mode_loss(synthetic):
    torch.manual_seed(0)
    model = Normalized()
    model.net[2].eval()  # a submodule the user keeps in eval mode stays so
    before = [t.clone() for t in [*model.parameters(), *model.buffers()]]
    rng, modes = torch.get_rng_state(), [m.training for m in model.modules()]
    plan = SimpleNamespace(dataset=synthetic, step=cross_entropy_step)
    score = Plan.score(plan, model, CPU)
    assert all(torch.equal(a, b) for a, b in zip(before, [*model.parameters(),
                                                          *model.buffers()]))
    assert torch.equal(rng, torch.get_rng_state())
    assert [m.training for m in model.modules()] == modes and False in modes
    model.eval()
    with torch.no_grad():
        expected = float(cross_entropy_step(model, (synthetic.train_x[:1024],
                                                    synthetic.train_y[:1024])))
    assert score == expected


def test_an_evaluation_leaves_the_mode_buffers_and_random_numbers_as_they_were(synthetic):
    torch.manual_seed(0)
    model = Normalized()
    buffers, rng = [b.clone() for b in model.buffers()], torch.get_rng_state()
    Evaluation(_leaves_eval_mode)(model, synthetic, CPU)
    Evaluation(_in_train_mode)(model, synthetic, CPU)
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    assert torch.equal(rng, torch.get_rng_state())


@pytest.mark.multiproc
def test_an_evaluate_leaving_eval_mode_does_not_change_real_training(tmp_path):
    options = {"run.steps": 4, "run.representative": "rank0"}
    watched = _run(tmp_path, "every", real=True, model=Normalized, evaluate=_leaves_eval_mode,
                   options={**options, "run.eval_every": 1})
    once = _run(tmp_path, "once", real=True, model=Normalized, evaluate=_leaves_eval_mode,
                options={**options, "run.eval_every": 0})
    a, b = (torch.load(r.run_dir / "model.pt") for r in (watched, once))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.multiproc
def test_choosing_the_best_on_real_processes_does_not_train(tmp_path):
    result = _run(tmp_path, "best", real=True, model=Normalized,
                  options={"run.steps": 4, "run.eval_every": 1, "run.representative": "best"})
    assert int(torch.load(result.run_dir / "model.pt")["net.2.num_batches_tracked"]) == 4


# --- evaluation is not training time ---------------------------------------------------------

def _slow(model, dataset, device):
    import time
    time.sleep(0.5)
    return 0.5, 1.0


@pytest.mark.parametrize("real", [False, pytest.param(True, marks=pytest.mark.multiproc)])
def test_no_worker_counts_the_evaluation_as_training(tmp_path, real):
    """wall_time is the training's: the last evaluation was taken off it twice (it came out
    0.5 s short, below zero here); on real processes the workers that wait for the leader's
    evaluation stop their clocks until it is done (they counted it as their next step's
    aggregation)."""
    result = _run(tmp_path, "slow", real=real, evaluate=_slow,
                  options={"run.eval_every": 1, "run.target_accuracy": 0})
    assert result.summary["eval_time"] >= 1.5 and 0 < result.summary["wall_time"] < 1.0
    steps = [r for r in result.metrics()]
    assert len(steps) == 6 and max(r["aggregation"] for r in steps) < 0.4
    assert max(r["time"] for r in steps) < 1.0


# --- when a run ends ----------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["hogwild", "allreduce"])
def test_the_run_ends_with_its_last_worker(tmp_path, strategy):
    """simulated_time is when the slowest worker ended, not the leader: hogwild's worker 0
    ended at a fifth of worker 1's time, and the summary said so while the last evaluation,
    timed by the last worker to reach it, came after the run's end."""
    run = _run(tmp_path, strategy, options={"strategy.name": strategy, "run.steps": 6,
                                            "compute.slowdown": [1, 5]})
    last = max(row["time"] for row in run.metrics())
    assert run.summary["simulated_time"] == last == run.evals()[-1]["time"]


def test_a_run_in_which_no_time_passed_has_no_rate(tmp_path):
    """No compute and no one to talk to: simulated_time 0, and samples_per_second null, not
    0 samples/s; the report shows it blank."""
    from fastsgd.report import load_run
    from fastsgd.report.table import rows, to_markdown

    run = _run(tmp_path, "none", options={"run.workers": 1, "compute.step_time": "",
                                          "compute.forward": "0s", "compute.backward": "0s"})
    assert run.summary["simulated_time"] == 0 and run.summary["samples_per_second"] is None
    assert "| 1 |" in to_markdown(rows([load_run(run.run_dir)]))


@pytest.mark.parametrize("real", [False, pytest.param(True, marks=pytest.mark.multiproc)])
def test_diloco_is_scored_on_its_global_model_between_outer_steps(tmp_path, real):
    """An evaluation in the middle of a DiLoCo round scores the global model of the last
    outer step (the papers' model), not the workers' average, which no worker holds: step
    6's score is step 4's; the consensus is still the workers' own replicas'."""
    options = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 8,
               "run.eval_every": 2, "strategy.name": "diloco", "strategy.period": 4,
               "run.tensorboard": False, "data.batch_size": 16, "run.out": str(tmp_path)}
    job = fs.Job(quiet=True, report=False, options=options)
    evals = {e["step"]: e for e in (job.run() if real else job.simulate()).evals()}
    assert evals[6]["loss"] == evals[4]["loss"] != evals[8]["loss"]
    assert evals[6]["accuracy"] == evals[4]["accuracy"]
    assert evals[6]["consensus_distance"] > 0 == evals[4]["consensus_distance"]
    assert evals[2]["loss"] > evals[4]["loss"]  # the initial model, before any outer step
