"""`Job(resume=RUN_DIR)`, with or without a config (`fastsgd simulate job.toml --resume
RUN_DIR`): a finished run or one with checkpoints is never started afresh over its files."""

import re
import shutil
from pathlib import Path

import pytest

from fastsgd import Job
from fastsgd.errors import UserError
from fastsgd.records import checkpoint

SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 3,
         "compute.model": "fixed", "compute.step_time": "2ms"}
NO_CHECKPOINT = r"has finished \(3 steps\) and has no checkpoint to train on from: to train " \
                r"longer, start a new run"


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".claimed"}


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
    """Two finished runs: without checkpoints, and with one every step."""
    root = tmp_path_factory.mktemp("finished")
    for name, every in (("bare", 0), ("kept", 1)):
        options = {**SMALL, "run.checkpoint_every": every, "run.out": str(root / name)}
        Job(options=options, quiet=True, report=False).simulate()
    return root


@pytest.fixture
def bare(finished_runs, tmp_path):
    return shutil.copytree(finished_runs / "bare", tmp_path / "bare")


@pytest.fixture
def kept(finished_runs, tmp_path):
    return shutil.copytree(finished_runs / "kept", tmp_path / "kept")


@pytest.mark.parametrize("steps", [None, 6])
def test_a_finished_run_without_a_checkpoint_says_to_start_a_new_one(bare, steps):
    options = {} if steps is None else {"run.steps": steps}
    before = _files(bare)
    with pytest.raises(UserError, match=rf"^{bare} {NO_CHECKPOINT}"):
        Job(resume=bare, options=options, quiet=True, report=False).simulate()
    assert _files(bare) == before


@pytest.mark.parametrize("steps", [None, 6])
def test_a_config_with_resume_never_starts_a_finished_run_afresh(bare, tmp_path, steps):
    config = shutil.copy(bare / "config.toml", tmp_path / "job.toml")
    options = {} if steps is None else {"run.steps": steps}
    before = _files(bare)
    with pytest.raises(UserError, match=rf"^{bare} {NO_CHECKPOINT}"):
        Job(resume=bare, config=config, options=options, quiet=True, report=False).simulate()
    assert _files(bare) == before  # neither cleared nor trained again


def test_a_config_with_resume_refuses_checkpoints_that_are_all_damaged(kept, tmp_path):
    """A folder that holds checkpoints goes on from one, as a plain resume does: not from
    step 0 on top of the old run's logs."""
    config = shutil.copy(kept / "config.toml", tmp_path / "job.toml")
    for step in checkpoint.steps(kept):
        (checkpoint.step_dir(kept, step) / "manifest.json").write_text("[]")
    before = _files(kept)
    for given in (None, config):
        with pytest.raises(UserError, match=r"every checkpoint there \(step 2, step 3\) is "
                                            r"damaged or unreadable"):
            Job(resume=kept, config=given, options={"run.steps": 5}, quiet=True,
                report=False).simulate()
    assert _files(kept) == before


def test_a_damaged_manifest_is_said_once_and_the_run_goes_on(kept, capsys):
    (checkpoint.step_dir(kept, 3) / "manifest.json").write_text('{"sha256": [null]}')
    Job(resume=kept, options={"run.steps": 4}, quiet=True, report=False).simulate()
    err = capsys.readouterr().err
    assert err.count("is unreadable") == 1, err
    assert checkpoint.steps(kept)[-1] == 4


@pytest.mark.parametrize("options, overwrite, culprit", [
    ({"run.out": "elsewhere"}, False, "run.out = 'elsewhere' with a resume of "),
    ({}, True, "overwrite (--overwrite) with a resume of "),
])
def test_a_resume_refuses_what_it_would_ignore(kept, options, overwrite, culprit):
    before = _files(kept)
    with pytest.raises(UserError, match="^" + re.escape(culprit)):
        Job(resume=kept, options=options, overwrite=overwrite, quiet=True)
    assert _files(kept) == before
