"""A training loop's checkpoints (resume.py): a resume with another model or optimizer than
the checkpoint's is refused in one line naming the key."""

import re
import shutil

import pytest
import torch

import fastsgd as fs
from fastsgd.errors import UserError

BASE = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 4,
        "run.checkpoint_every": 2, "run.eval_every": 4}


def small_mlp() -> torch.nn.Module:
    """The class of the built-in mlp (nn.Sequential), other tensors."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "run"
    fs.Job(options={**BASE, "run.out": str(out)}, quiet=True).simulate()
    return out


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the run for each test."""
    return shutil.copytree(finished, tmp_path / "run")


@pytest.mark.parametrize("key,value,message", [
    ("model.name", "lenet", "another model: model.name = 'mlp', not 'lenet'"),
    ("optimizer.name", "adam", "another optimizer: optimizer.name = 'sgd', not 'adam'"),
    ("model.name", "tests.test_resume:small_mlp",
     "another model: it does not fit model.name = 'tests.test_resume:small_mlp'")])
def test_a_resume_with_another_model_or_optimizer_is_one_line(run, key, value, message):
    config = (run / "config.toml").read_text()
    job = fs.Job(resume=run, quiet=True, options={"run.steps": 6, key: value})
    with pytest.raises(UserError, match=re.escape(f"rank-00000.pt was written by {message}")):
        job.simulate()
    assert (run / "config.toml").read_text() == config  # a plain --resume still works


def test_a_resume_takes_the_optimizer_settings_it_is_given(run):
    # lr 1e-30 from step 4 on: momentum SGD moves next to nothing, where the checkpoint's
    # lr (0.05) would move every weight
    before = torch.load(run / "model.pt", weights_only=True)
    fs.Job(resume=run, quiet=True, options={"run.steps": 6, "optimizer.lr": 1e-30}).simulate()
    after = torch.load(run / "model.pt", weights_only=True)
    assert max(float((after[k] - before[k]).abs().max()) for k in before) < 1e-20


# Only real processes lack the simulator's clock: the run's checkpoints hold its own.
@pytest.mark.multiproc
def test_a_simulated_run_does_not_resume_on_real_processes(run):
    with pytest.raises(UserError, match="written by fastsgd simulate: resume it with fastsgd "
                                        "simulate --resume"):
        fs.Job(resume=run, quiet=True, options={"run.steps": 6}).run()
