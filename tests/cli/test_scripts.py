"""`fastsgd pack train.py`: an error in importing the user's script is one line that names
the script and its own line, with exit code 2; the script runs as `python train.py` would
(its argv), and `--set` changes its job as it changes a config file's."""

import json
import sys
import zipfile

import pytest

from fastsgd.cli.main import main
from fastsgd.cli.scripts import job_from_script
from fastsgd.config import schema as cfg
from fastsgd.errors import UserError
from fastsgd.strategies import CHOICES


@pytest.mark.parametrize("text, says", [
    ("import os\nimport nonexistent_module_xyz\n",
     ", line 2: ModuleNotFoundError: No module named 'nonexistent_module_xyz'"),
    ("def f():\n    raise RuntimeError('boom\\nsecond line')\n\n\nf()\n",
     ", line 2: RuntimeError: boom"),
    ("import sys\nsys.exit(3)\n", ", line 2: SystemExit: 3"),
    # a syntax error in a module it imports: the script's import line, not that module's
    ("import os\nimport broken_helper_xyz\n",
     ", line 2: SyntaxError: '(' was never closed (broken_helper_xyz.py, line 1)"),
])
def test_an_error_in_importing_the_script_is_one_line_at_its_line(tmp_path, capsys, text, says):
    (tmp_path / "broken_helper_xyz.py").write_text("x = (\n")
    script = tmp_path / "train.py"
    script.write_text(text)
    assert main(["pack", str(script)]) == 2
    assert capsys.readouterr().err == f"fastsgd: error: {script}{says}\n"


@pytest.mark.parametrize("source, says", [
    ("twojobs.py:", "twojobs.py:: the job's name after ':' is empty; write twojobs.py:NAME"),
    ("job.fsj", "job.fsj is a job archive already: train it with fastsgd run job.fsj"),
])
def test_what_cannot_be_packed_is_named(tmp_path, monkeypatch, capsys, source, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "twojobs.py").write_text("")
    (tmp_path / "job.fsj").write_bytes(b"PK")
    assert main(["pack", source]) == 2
    assert capsys.readouterr().err == f"fastsgd: error: {says}\n"


JOB = ('import fastsgd as fs\n'
       'job = fs.Job(model="mlp", data="synthetic", options={"run.workers": 2})\n')


@pytest.mark.parametrize("strategy", ["dpsgd", "sgp", "localsgd", "ddp"])
def test_set_strategy_name_drops_the_old_strategys_keys(tmp_path, strategy):
    """As `--set` on a config file: the script's allreduce keys (bucket_mb, keep_residual)
    configured allreduce, and the new strategy starts from its own defaults."""
    script = tmp_path / "train.py"
    script.write_text(JOB)
    job = job_from_script(script, None, {"strategy.name": strategy})
    chosen = cfg.load(CHOICES, None, [f"strategy.name={strategy}"])
    assert job.config["strategy"] == chosen["strategy"]


def test_a_script_packed_with_another_strategy_carries_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(JOB)
    assert main(["pack", "train.py", "--set", "strategy.name=dpsgd", "--out", "x.fsj"]) == 0
    assert "fastsgd run x.fsj" in capsys.readouterr().out
    with zipfile.ZipFile(tmp_path / "x.fsj") as z:
        strategy = json.loads(z.read("manifest.json"))["config"]["strategy"]
    assert strategy == cfg.load(CHOICES, None, ["strategy.name=dpsgd"])["strategy"]


ARGPARSE = ('import argparse, sys\n'
            'import fastsgd as fs\n'
            'open(sys.argv[0] + ".argv", "w").write(repr(sys.argv))\n'
            'p = argparse.ArgumentParser()\n'
            'p.add_argument("--lr", type=float, default=0.1)\n'
            'args = p.parse_args()\n'
            'job = fs.Job(model="mlp", data="synthetic", options={"optimizer.lr": args.lr})\n')


def test_the_script_sees_the_argv_python_would_give_it(tmp_path, monkeypatch):
    """A module-level argparse parses [script], not fastsgd's own arguments; sys.argv is
    fastsgd's again afterwards, also where the script fails."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "argp.py").write_text(ARGPARSE)
    argv = ["fastsgd", "pack", "argp.py", "--out", "argp.fsj"]
    monkeypatch.setattr(sys, "argv", list(argv))
    job = job_from_script("argp.py", None, {})
    assert job.config["optimizer"]["lr"] == 0.1
    assert (tmp_path / "argp.py.argv").read_text() == repr(["argp.py"])
    assert sys.argv == argv
    (tmp_path / "fails.py").write_text("raise RuntimeError('no')\n")
    with pytest.raises(UserError):
        job_from_script("fails.py", None, {})
    assert sys.argv == argv


def test_the_users_optimizer_is_named_by_the_script_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "customopt.py").write_text(
        "import torch\nimport fastsgd as fs\nclass MyOpt(torch.optim.SGD):\n    pass\n"
        "job = fs.Job(model='mlp', data='synthetic', optimizer=lambda p: MyOpt(p, lr=0.1))\n")
    assert main(["pack", "customopt.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastsgd: error: optimizer.name = 'customopt.py:MyOpt' is the user's "
                          "Python code") and err.count("\n") == 1, err
    assert not (tmp_path / "customopt.fsj").exists()
