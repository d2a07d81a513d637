"""The `ddp` baseline: torch's DistributedDataParallel on the same work as fastsgd's
allreduce trains the same model (both are large-batch SGD) and is counted the same bytes."""

import pytest
import torch

import fastsgd as fs
from fastsgd.errors import ConfigError, UserError
from tests.loop.test_worker import InfiniteSlopeOnMarkedBatches, _with_nan_samples, marked_digits

OPTIONS = {"data.name": "digits", "model.name": "mlp", "run.steps": 40, "run.eval_every": 20}


def _run(tmp_path, strategy, **extra):
    options = {**OPTIONS, "run.out": str(tmp_path / strategy), **extra}
    return fs.Job(strategy=strategy, options=options, quiet=True).run(workers=2)


@pytest.mark.multiproc
def test_ddp_trains_what_allreduce_trains(tmp_path):
    ddp, ours = _run(tmp_path, "ddp"), _run(tmp_path, "allreduce")
    a = torch.load(ddp.run_dir / "model.pt", weights_only=True)
    b = torch.load(ours.run_dir / "model.pt", weights_only=True)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    sent = {r.summary["strategy"]: r.summary["bytes_sent_total"] for r in (ddp, ours)}
    assert sent["ddp"] == sent["allreduce"] > 0


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy", ["ddp", "allreduce"])
def test_a_gradient_not_finite_under_a_finite_loss_leaves_every_replica_finite(tmp_path,
                                                                              strategy):
    """Both all-reduce buckets during backward, before the worker's own finite check. DDP
    has written the mean into every worker's gradients by then, so each worker's check
    sees it; allreduce's buckets are still in flight, and it checks the mean once they
    land. Either way every worker drops that step alike (real processes, gloo)."""
    data = marked_digits()
    result = fs.Job(model=lambda: InfiniteSlopeOnMarkedBatches(data), data=data,
                    strategy=strategy, quiet=True,
                    options={**OPTIONS, "run.out": str(tmp_path), "run.steps": 30,
                             "run.eval_every": 0}).run(workers=2)
    assert result.summary["skipped_steps"] > 0
    assert all(m["loss"] == m["loss"] for m in result.metrics())  # every loss finite
    assert result.summary["consensus_distance"] == 0
    params = torch.load(result.run_dir / "model.pt", weights_only=True)
    assert all(torch.isfinite(p).all() for p in params.values())


@pytest.mark.multiproc
def test_a_loss_not_finite_on_one_worker_drops_the_step_on_every_worker(tmp_path):
    """DDP's reducer waits in backward for every worker's gradients: the worker whose loss
    is NaN (a corrupt sample) still runs its backward, with NaN gradients, so the mean is
    NaN everywhere and every worker drops that step alike, rather than its peers waiting
    for it until run.timeout."""
    data = _with_nan_samples(97)
    result = fs.Job(model="mlp", data=data, strategy="ddp", quiet=True,
                    options={**OPTIONS, "run.out": str(tmp_path), "run.steps": 30,
                             "run.eval_every": 0, "run.timeout": 60}).run(workers=2)
    assert result.summary["skipped_steps"] > 0
    assert result.summary["consensus_distance"] == 0
    params = torch.load(result.run_dir / "model.pt", weights_only=True)
    assert all(torch.isfinite(p).all() for p in params.values())


def test_the_simulator_refuses_ddp_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="'ddp' runs on real processes only"):
        fs.Job(strategy="ddp", options={**OPTIONS, "run.out": str(tmp_path / "s")}).simulate(2)


def test_ddp_with_a_codec_is_one_line(tmp_path):
    with pytest.raises(UserError, match="'fp16' .* does not apply to strategy.name = 'ddp'"):
        _run(tmp_path, "ddp", **{"compression.name": "fp16"})
