"""A training loop's checkpoints (resume.py): a resume with another model or optimizer than
the checkpoint's is refused in one line naming the key."""

import re
import shutil
from pathlib import Path

import pytest
import torch

import fastsgd as fs
from fastsgd.errors import UserError
from fastsgd.records import checkpoint
from fastsgd.transport.sim import simulate

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
    ("model.name", "tests.loop.test_resume:small_mlp",
     "another model: it does not fit model.name = 'tests.loop.test_resume:small_mlp'")])
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


def test_a_resume_with_a_config_goes_on_from_the_checkpoint(run, tmp_path):
    """`fastsgd run job.toml --resume RUN` (the same command line after a restart, as under
    torchrun --max-restarts): once RUN holds a checkpoint it goes on from there; the
    checkpoints were removed as an old run's files and it trained again from step 0."""
    metrics = run / "metrics.jsonl"
    first, rest = metrics.read_text().split("\n", 1)
    marked = first.replace('"step": 1,', '"step": 1, "marker": 1,')
    metrics.write_text(marked + "\n" + rest)  # kept by a resume, gone with a fresh start
    config = tmp_path / "job.toml"
    shutil.copy(run / "config.toml", config)
    fs.Job(resume=run, config=config, quiet=True, options={"run.steps": 6}).simulate()
    assert metrics.read_text().startswith(marked + "\n")
    assert checkpoint.steps(run) == [4, 6]
    fresh = tmp_path / "fresh"  # no checkpoint yet: it starts
    fs.Job(resume=fresh, config=config, quiet=True, options={"run.steps": 2}).simulate()
    assert (fresh / "summary.json").is_file()


# Only real processes lack the simulator's clock: the run's checkpoints hold its own.
@pytest.mark.multiproc
def test_a_simulated_run_does_not_resume_on_real_processes(run):
    with pytest.raises(UserError, match="written by fastsgd simulate: resume it with fastsgd "
                                        "simulate --resume"):
        fs.Job(resume=run, quiet=True, options={"run.steps": 6}).run()



def test_a_resume_with_another_number_of_workers_says_how_many(run):
    """The checkpoints exist, of 2 workers: not "no complete checkpoint ... for all 3"."""
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    job = fs.Job(resume=run, quiet=True, options={"run.steps": 6, "run.workers": 3})
    with pytest.raises(UserError) as info:
        job.simulate()
    assert str(info.value) == (f"{run}'s checkpoints are of 2 workers but run.workers = 3; "
                               "resume with run.workers = 2")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    fs.Job(resume=run, quiet=True, options={"run.steps": 6, "run.workers": 2}).simulate()
    assert (run / "checkpoints" / "step-00000006").is_dir()


def _shrunk_checkpoint(run_dir: Path) -> None:
    """The checkpoint of step 10 of a run of 3 workers that lost worker 0 (it shrank)."""
    digests = [checkpoint.save_worker(run_dir, 10, r, {"x": torch.full((2,), float(r))}).hex()
               for r in (1, 2)]
    checkpoint.commit(run_dir, 10, digests, keep=2, members=[1, 2], workers=3)


def _agree(run_dir: Path, workers: int, required: bool = True) -> list:
    def worker(t):
        found = checkpoint.agree_step(run_dir, t, required=required)
        return found and (found[0], float(checkpoint.load(found[1])["x"][0]))
    return simulate(workers, worker)


def test_a_run_that_shrank_resumes_with_all_its_workers_and_only_with_them(tmp_path,
                                                                          monkeypatch):
    _shrunk_checkpoint(tmp_path)
    # the lost worker 0 starts again from the lowest survivor's file
    assert _agree(tmp_path, 3) == [(10, 1.0), (10, 1.0), (10, 2.0)]
    says = (f"{tmp_path}'s checkpoints are of 3 workers but run.workers = 2; resume with "
            "run.workers = 3")
    for required in (True, False):  # not required: a config given beside --resume
        with pytest.raises(UserError, match=f"^{re.escape(says)}$"):
            _agree(tmp_path, 2, required)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    with pytest.raises(UserError, match=re.escape("are of 3 workers but torchrun started 4; "
                                                  "resume with 3 workers")):
        _agree(tmp_path, 4)


@pytest.mark.parametrize("key,value,was", [("run.seed", 7, "0"), ("data.batch_size", 64, "32"),
                                           ("strategy.name", "dpsgd", "'allreduce'")])
def test_a_resume_that_would_change_what_the_run_is_is_one_line(run, key, value, was):
    with pytest.raises(UserError) as info:
        fs.Job(resume=run, quiet=True, options={"run.steps": 6, key: value})
    assert str(info.value) == (f"cannot resume {run} with {key} = {value!r}: it was trained "
                               f"with {was}, and a run must keep its {key}; resume with that, "
                               "or start a new run")


def test_a_finished_run_says_so_instead_of_training_its_last_steps_again(run):
    """Its newest checkpoint before its end: a Ctrl-C's at step 2 in a run without
    run.checkpoint_every, which was resumed and ran to its end (a run whose last checkpoint
    is its end is told so by its workers: test_checkpoint.py)."""
    shutil.rmtree(checkpoint.step_dir(run, 4))
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(UserError, match=rf"^{run} has finished: its 4 steps are done; to train "
                                        r"on, resume with more \(--set run.steps=8, say\)$"):
        fs.Job(resume=run, quiet=True).simulate()
    assert (run / "metrics.jsonl").read_text() == before


def _rewrite_strategy_state(run: Path, step: int, change) -> None:
    """Change each worker's saved strategy state with `change` and seal the checkpoint
    again (new digests in its manifest), as a checkpoint of another version would be."""
    files = sorted(checkpoint.step_dir(run, step).glob("rank-*.pt"))
    digests = []
    for file in files:
        saved = torch.load(file, weights_only=True)
        change(saved["replica"]["strategy"])
        saved.pop("format")
        digests.append(checkpoint.save_worker(run, step, int(file.stem[5:]), saved).hex())
    checkpoint.commit(run, step, digests, keep=0)


def test_a_strategy_state_of_another_shape_is_one_line_naming_its_place(tmp_path):
    run = tmp_path / "run"
    options = {**BASE, "strategy.name": "diloco", "strategy.period": 2,
               "compression.name": "qsgd"}
    fs.Job(options={**options, "run.out": str(run)}, quiet=True).simulate()

    def longer(state):  # the first tensor one element longer, found wherever it is
        stack = [(state, k) for k in state]
        while stack:
            holder, key = stack.pop(0)
            value = holder[key]
            if isinstance(value, torch.Tensor) and value.dim() == 1 and len(value) > 1:
                holder[key] = torch.cat([value, value[:1]])
                return
            if isinstance(value, dict):
                stack += [(value, k) for k in value]
            elif isinstance(value, list):
                stack += [(value, i) for i in range(len(value))]
        raise AssertionError("no 1-D tensor in the strategy's state")

    _rewrite_strategy_state(run, 4, longer)
    job = fs.Job(resume=run, quiet=True, options={"run.steps": 6})
    with pytest.raises(UserError, match=r"rank-00000\.pt was written by another strategy: it "
                       r"does not fit strategy\.name = 'diloco' \(state\[.*\] holds a tensor "
                       r"of shape \(\d+,\) where this run's has \(\d+,\)\)"):
        job.simulate()
