"""A packed job trains without its source, to bitwise the parameters the source job reaches:
in the simulator, on real processes and under torchrun, for an MLP and LeNet, with
allreduce and dpsgd."""

import io
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

from fastsgd import Job
from fastsgd.testing.ports import free_port
from tests.launch.test_torchrun import torchrun
from tests.pack.user_job import SECRETS, write_script

SMALL = {"run.workers": 4, "run.steps": 20, "run.eval_every": 10, "compute.model": "fixed",
         "compute.step_time": "5ms"}


def _params(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)


def _same(a, b) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("model", ["mlp", "lenet"])
@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd"])
def test_a_packed_job_simulates_bitwise_as_its_source(model, strategy, tmp_path):
    options = {**SMALL, "strategy.name": strategy}
    source = Job(model=model, data="synthetic", options={**options, "run.out": str(
        tmp_path / "source")}, quiet=True)
    source.pack(tmp_path / "job.fsj")
    first = source.simulate()
    again = Job(config=str(tmp_path / "job.fsj"), quiet=True,
                options={**options, "run.out": str(tmp_path / "packed")}).simulate()
    assert _same(_params(first.run_dir), _params(again.run_dir))
    assert first.metrics() == again.metrics() and first.evals() == again.evals()


def test_a_packed_language_model_simulates_bitwise_as_its_source(tmp_path):
    """The GPT's step scores the next token and its forward takes the windows less their
    last token: both graphs as the source job runs them (the step's shapes are multiples
    of the batch's symbol, which the archive's validator takes)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"f{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + 1\n" * 60)
    options = {**SMALL, "model.name": "gpt", "data.name": "text", "data.path": str(corpus),
               "model.context": 16, "model.layers": 1, "model.width": 16, "model.heads": 2,
               "data.batch_size": 4}
    source = Job(options={**options, "run.out": str(tmp_path / "source")}, quiet=True)
    source.pack(tmp_path / "gpt.fsj")
    first = source.simulate()
    again = Job(config=str(tmp_path / "gpt.fsj"), quiet=True,
                options={**options, "model.name": "packed", "run.out": str(tmp_path / "packed")}
                ).simulate()
    source_params, packed_params = _params(first.run_dir), _params(again.run_dir)
    assert set(source_params) - set(packed_params) == {"head.weight"}  # tied to tokens'
    assert all(torch.equal(source_params[k], packed_params[k]) for k in packed_params)
    assert first.evals() == again.evals()


def _archive_text(path) -> bytes:
    """Every byte the archive holds, uncompressed, the graphs' own members included."""
    with zipfile.ZipFile(path) as z:
        members = [z.read(n) for n in z.namelist()]
        names = z.namelist()
    for data in list(members):
        if data[:2] == b"PK":
            with zipfile.ZipFile(io.BytesIO(data)) as inner:
                members += [inner.read(n) for n in inner.namelist()]
                names += inner.namelist()
    assert not [n for n in names if n.endswith((".py", ".pyc"))]
    return b"\n".join(members)


def _fastsgd(*args, cwd, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "fastsgd", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def packed_away(tmp_path_factory):
    """A user's script run as it is, then packed; then its source is deleted. Returns the
    archive and the source run's folder."""
    home = tmp_path_factory.mktemp("user")
    script = write_script(home)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script)], cwd=home, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _fastsgd("pack", script.name, "--out", "job.fsj", cwd=home)
    script.unlink()
    shutil.rmtree(home / "__pycache__", ignore_errors=True)
    return home / "job.fsj", home / "source-run"


@pytest.mark.multiproc
def test_the_archive_holds_nothing_of_the_source(packed_away):
    text = _archive_text(packed_away[0])
    for secret in SECRETS:
        assert secret.encode() not in text, secret


@pytest.mark.multiproc
def test_a_packed_job_trains_elsewhere_without_its_source(packed_away, tmp_path):
    archive, source_run = packed_away
    _fastsgd("run", str(archive), "--quiet", "--no-report", "--set", "run.out=packed-run",
             cwd=tmp_path)
    assert _same(_params(source_run), _params(tmp_path / "packed-run"))


@pytest.mark.multiproc
def test_a_packed_job_trains_under_torchrun(packed_away, tmp_path):
    archive, source_run = packed_away
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*torchrun(), "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), "-m", "fastsgd", "run",
           str(archive), "--quiet", "--set", "run.out=torchrun-run"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _same(_params(source_run), _params(tmp_path / "torchrun-run"))


@pytest.mark.multiproc
def test_lenet_with_dpsgd_packed_from_a_config_trains_bitwise(tmp_path):
    (tmp_path / "lenet.toml").write_text(
        '[run]\nworkers = 2\nsteps = 24\neval_every = 24\n[data]\nname = "digits"\n'
        '[model]\nname = "lenet"\n[strategy]\nname = "dpsgd"\n')
    _fastsgd("run", "lenet.toml", "--quiet", "--no-report", "--set", "run.out=source", cwd=tmp_path)
    _fastsgd("pack", "lenet.toml", cwd=tmp_path)
    _fastsgd("run", "lenet.fsj", "--quiet", "--no-report", "--set", "run.out=packed", cwd=tmp_path)
    assert _same(_params(tmp_path / "source"), _params(tmp_path / "packed"))
