"""`Job`: what it refuses before any worker starts, and how options meet a config file."""

import pytest

import fastsgd.job
from fastsgd import Job
from fastsgd import config as cfg
from fastsgd.errors import ConfigError, UserError

SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 3}


def test_a_global_batch_over_the_training_set_fails_before_forking(tmp_path, monkeypatch):
    def forked(*args, **kwargs):
        raise AssertionError("workers were started")
    monkeypatch.setattr(fastsgd.job, "supervise", forked)
    job = Job(options={**SMALL, "run.workers": 1000, "run.out": str(tmp_path / "run")},
              quiet=True)
    with pytest.raises(UserError, match="data.batch_size 32 x 1000 workers exceeds the"):
        job.run()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("raw", [{"run": 5}, {"run": [1, 2]}, {"run": [{"workers": 2}]},
                                 {"model": 5}])
def test_a_section_that_is_not_a_table_fails_before_options_go_in(raw):
    with pytest.raises(ConfigError, match=r"must be a table of key = value"):
        Job(config=raw, options=SMALL)


def test_a_file_section_that_is_not_a_table_names_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("model = 5\n")
    with pytest.raises(ConfigError, match=r"c.toml: \[model\] must be a table"):
        Job(config=path)


def test_another_strategy_runs_a_written_config(tmp_path):
    path = tmp_path / "config.toml"  # as a run writes it: all of allreduce's options
    path.write_text(cfg.to_toml(Job(options=SMALL).config))
    job = Job(config=path, options={"strategy.name": "dpsgd"})
    assert job.config["strategy"]["name"] == "dpsgd" and "bucket_mb" not in job.config["strategy"]
    assert Job(config=path, strategy="sgp").config["strategy"]["name"] == "sgp"
    with pytest.raises(ConfigError, match="unknown config key 'strategy.bucket_mb'"):
        Job(config=path, options={"strategy.name": "dpsgd", "strategy.bucket_mb": 5})


def test_an_archive_is_its_own_model_packed(tmp_path):
    archive = tmp_path / "job.fsj"
    archive.write_bytes(b"")  # refused before it is read
    with pytest.raises(ConfigError, match="model.packed = 'other.fsj': .*job.fsj is a job"):
        Job(config=archive, options={"model.packed": "other.fsj"})


def _fails_on_worker_1(model, batch):
    import os

    import torch.nn.functional as F
    if os.environ["RANK"] == "1":
        raise ValueError("the user's step fails on worker 1")
    x, y = batch
    return F.cross_entropy(model(x), y)


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd"])
def test_a_worker_whose_step_fails_ends_the_run_at_once(tmp_path, strategy):
    """Its peer waits for it in the step's collective: the failed worker says no goodbye,
    which would wait for the peer's (30 s, the messenger's timeout) before it reports."""
    import time

    from fastsgd.errors import WorkerFailed
    job = Job(step=_fails_on_worker_1, options={**SMALL, "strategy.name": strategy,
                                                "run.out": str(tmp_path / "run")}, quiet=True)
    began = time.monotonic()
    with pytest.raises(WorkerFailed, match="^worker 1 failed: ValueError: the user's step"):
        job.run()
    assert time.monotonic() - began < 20
