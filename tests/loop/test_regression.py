"""A regression: a torch dataset of floating-point targets trains with the mean squared error
by default (loop/regression.py), in `run` and `simulate` alike, and is scored by its loss."""

import json

import pytest
import torch

import fastsgd
from fastsgd.errors import UserError
from fastsgd.report import text_report
from fastsgd.workloads.dataset import Dataset


def _linear_data(n=400, outputs=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, outputs, generator=g) + 0.05 * torch.randn(n, outputs, generator=g)
    return torch.utils.data.TensorDataset(x, y if outputs > 1 else y[:, 0])


def _model(outputs=1):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, outputs))


def _job(tmp_path, name, data=None, model=None, **options):
    return fastsgd.Job(model=model or _model(), data=data or _linear_data(), quiet=True,
                       report=True, options={
                           "run.epochs": 4, "run.workers": 2, "data.batch_size": 16,
                           "optimizer.lr": 0.02, "run.eval_every": 0,
                           "run.out": str(tmp_path / name), **options})


def test_a_regression_is_fitted_and_scored_by_its_squared_error(tmp_path):
    data = _linear_data()
    variance = float(data.tensors[1].var())
    result = _job(tmp_path, "sim", data=data).simulate()
    s = result.summary
    assert s["data_kind"] == "regression"
    assert s["final_accuracy"] is None and s["final_perplexity"] is None
    assert s["final_loss"] < 0.1 * variance  # the targets' own variance: predicting the mean
    evals = [json.loads(line) for line in open(result.run_dir / "eval.jsonl")]
    assert evals[-1]["accuracy"] is None  # null: strict JSON, no NaN
    assert "mean squared error" in text_report(result.run_dir)
    plots = {p.name for p in (result.run_dir / "report").glob("*.png")}
    assert "loss_time.png" in plots and "accuracy_time.png" not in plots
    header = next(line for line in open(result.run_dir / "report" / "report.md")
                  if line.startswith("| run |"))
    assert "| loss |" in header and "accuracy" not in header and "perplexity" not in header


@pytest.mark.multiproc
def test_real_and_simulated_regressions_end_alike(tmp_path):
    real = torch.load(_job(tmp_path, "real").run().run_dir / "model.pt", weights_only=True)
    sim = torch.load(_job(tmp_path, "sim").simulate().run_dir / "model.pt", weights_only=True)
    assert max(float((real[k] - sim[k]).abs().max()) for k in sim) < 1e-6


def test_several_targets_per_sample(tmp_path):
    job = _job(tmp_path, "three", data=_linear_data(outputs=3), model=_model(outputs=3),
               **{"run.epochs": 1})
    assert job.simulate().summary["final_loss"] is not None


def test_a_model_whose_output_does_not_match_the_targets_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^the default step of a regression needs a model "
                                        r"returning one value per target, shape \(16,\) .* "
                                        r"returned shape \(16, 3\): pass step="):
        _job(tmp_path, "bad", model=_model(outputs=3)).simulate()


def test_bad_targets_and_models_are_one_line(tmp_path):
    x = torch.randn(40, 8)
    y = torch.randn(40)
    y[7] = float("nan")
    with pytest.raises(UserError, match=r"train_y\[7\] is nan; a regression's targets must "
                                        r"be finite"):
        Dataset("mine", x, y, x[:4], y[:4].nan_to_num(), 1, kind="regression")
    with pytest.raises(UserError, match=r"train_y is float32; it must hold integer class "
                                        r"labels .* or floating-point targets with "
                                        r"kind='regression'"):
        Dataset("mine", x, y, x, y, 1)
    with pytest.raises(UserError, match=r"^model.name = 'mlp' is a built-in model of images "
                                        r"or tokens; 'TensorDataset' holds a regression's "
                                        r"targets: give a model of your own"):
        fastsgd.Job(data=_linear_data(), model="mlp", quiet=True,
                    options={"run.out": str(tmp_path / "m")}).simulate()
