"""The `ddp` baseline: torch's DistributedDataParallel on the same work as fastsgd's
allreduce trains the same model (both are large-batch SGD) and is counted the same bytes."""

import pytest
import torch

import fastsgd as fs
from fastsgd.errors import ConfigError, UserError

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


def test_the_simulator_refuses_ddp_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="'ddp' runs on real processes only"):
        fs.Job(strategy="ddp", options={**OPTIONS, "run.out": str(tmp_path / "s")}).simulate(2)


def test_ddp_with_a_codec_is_one_line(tmp_path):
    with pytest.raises(UserError, match="'fp16' .* does not apply to strategy.name = 'ddp'"):
        _run(tmp_path, "ddp", **{"compression.name": "fp16"})
