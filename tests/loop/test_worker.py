"""The per-worker loop (worker.py): bad batches are skipped and counted, not fatal at once."""

from dataclasses import replace

import pytest
import torch

import fastsgd as fs
from fastsgd.errors import UserError
from fastsgd.workloads.data import load_dataset

OPTIONS = {"run.workers": 2, "run.steps": 40, "run.eval_every": 0, "data.batch_size": 16,
           "compute.model": "fixed", "compute.step_time": "1ms"}


def _with_nan_samples(every: int):
    """digits, with every `every`-th training sample all NaN (a corrupt input)."""
    data = load_dataset("digits")
    x = data.train_x.clone()
    x[::every] = float("nan")
    return replace(data, train_x=x, source=None)


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd", "localsgd"])
def test_nan_batches_are_skipped_and_counted(tmp_path, strategy):
    result = fs.Job(model="mlp", data=_with_nan_samples(97), strategy=strategy, quiet=True,
                    options={**OPTIONS, "run.out": str(tmp_path)}).simulate()
    bad = [m for m in result.metrics() if m["loss"] != m["loss"]]  # NaN
    assert bad and result.summary["skipped_steps"] == len(bad)
    params = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.isfinite(p).all() for p in params.values())
    assert result.accuracy > 0.8


def marked_digits():
    """digits, with every 97th training sample's first pixel 99 (see the model below)."""
    data = load_dataset("digits")
    x = data.train_x.clone()
    x[::97].view(len(x[::97]), -1)[:, 0] = 99
    return replace(data, train_x=x, source=None)


class InfiniteSlopeOnMarkedBatches(torch.nn.Module):
    """An MLP whose loss stays finite on a batch holding a marked sample (first pixel 99)
    while one gradient is not: sqrt's slope at 0 is inf, and 0 * inf is NaN. Elsewhere that
    gradient is 0 * 0.5 (every parameter takes part in every step, as DDP requires)."""

    def __init__(self, data):
        super().__init__()
        from fastsgd.workloads.models import build_model

        self.mlp = build_model("mlp", data.input_shape, data.num_classes)
        self.at_zero = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        marked = bool((x.flatten(1)[:, 0] == 99).any())
        return self.mlp(x) + 0 * torch.sqrt(self.at_zero + (0.0 if marked else 1.0))


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd"])
def test_a_batch_whose_gradient_is_not_finite_is_skipped_though_its_loss_is(tmp_path, strategy):
    """allreduce's buckets leave during backward (overlap), before the loop sees the
    gradient: the mean is not finite then, and every worker drops that step alike."""
    data = marked_digits()
    result = fs.Job(model=lambda: InfiniteSlopeOnMarkedBatches(data), data=data,
                    strategy=strategy, quiet=True,
                    options={**OPTIONS, "run.out": str(tmp_path)}).simulate()
    assert all(m["loss"] == m["loss"] for m in result.metrics())  # every loss finite
    assert result.summary["skipped_steps"] > 0
    params = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.isfinite(p).all() for p in params.values())
    assert result.accuracy > 0.8


def test_too_many_bad_steps_in_a_row_stop_naming_worker_and_step(tmp_path):
    job = fs.Job(model="mlp", data=_with_nan_samples(1), strategy="allreduce", quiet=True,
                 options={**OPTIONS, "run.out": str(tmp_path), "run.max_bad_steps": 3})
    with pytest.raises(UserError, match=r"worker 0: loss nan at step 4, 4 steps in a row "
                                        r"\(run.max_bad_steps = 3\)"):
        job.simulate()


def test_a_checkpoints_evaluation_log_from_before_the_wall_time_to_target_still_loads(tmp_path):
    from fastsgd.loop.observe import EvalLog

    log = EvalLog(tmp_path / "eval.jsonl", 0.5)
    log.load([(10, 0.6, 1.0, 0.0), 3.5, 1, 0.25])  # written before wall_to_target existed
    assert (log.time_to_target, log.count, log.wall_to_target) == (3.5, 1, None)
    again = EvalLog(tmp_path / "eval.jsonl", 0.5)
    log.wall_to_target = 7.25
    again.load(log.state())
    assert again.state() == log.state()
