"""The run directory is a contract (DESIGN.md §1): later tools read exactly these fields."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

import fastsgd as fs
from fastsgd.config import schema as cfg
from fastsgd.errors import UserError
from fastsgd.records import checkpoint
from fastsgd.records.metrics import PHASES
from fastsgd.records.rundir import claim, hold, release
from fastsgd.strategies import CHOICES

METRIC_KEYS = {"step", "rank", "time", "loss", "lr", *PHASES, "bytes_sent", "bytes_received",
               "staleness"}
SUMMARY_KEYS = {"strategy", "compressor", "topology", "workers", "steps", "final_accuracy",
                "time_to_target", "wall_to_target", "wall_time", "simulated_time",
                "bytes_sent_total",
                "consensus_distance"}


@pytest.fixture(scope="module")
def run(synthetic, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    job = fs.Job(model="mlp", data=synthetic, quiet=True,
                 options={"run.steps": 40, "run.eval_every": 10, "data.batch_size": 16,
                          "run.target_accuracy": 0.2, "run.out": str(out)})
    return job.simulate(workers=3)


def test_files(run):
    names = {p.name for p in run.run_dir.iterdir()}
    assert {"config.toml", "metrics.jsonl", "eval.jsonl", "summary.json", "model.pt"} <= names


def test_metrics_one_line_per_worker_per_step(run):
    rows = run.metrics()
    assert all(set(r) == METRIC_KEYS for r in rows)
    assert sorted((r["step"], r["rank"]) for r in rows) == [
        (s, w) for s in range(1, 41) for w in range(3)]
    for rank in range(3):
        times = [r["time"] for r in rows if r["rank"] == rank]
        assert times == sorted(times) and times[0] > 0


def test_eval_and_summary(run):
    evals = run.evals()
    assert [e["step"] for e in evals] == [10, 20, 30, 40]
    assert all(set(e) == {"step", "time", "accuracy", "loss", "perplexity", "consensus_distance"}
               for e in evals)
    s = json.loads((run.run_dir / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(s)
    assert s["final_accuracy"] == evals[-1]["accuracy"] and s["workers"] == 3
    assert s["simulated_time"] == pytest.approx(max(r["time"] for r in run.metrics()), rel=0.05)
    reached = next(e["time"] for e in evals if e["accuracy"] >= 0.2)
    assert s["time_to_target"] == reached
    # the wall seconds of the simulation, evaluations included, by the evaluation that got there
    assert 0 < s["wall_to_target"] <= s["wall_time"] + s["eval_time"]
    assert s["consensus_distance"] == 0.0


def test_config_and_model_reload(run, synthetic):
    config = cfg.load(CHOICES, run.run_dir / "config.toml")
    assert config["run"]["out"] == str(run.run_dir) and config["run"]["steps"] == 40
    state = torch.load(run.run_dir / "model.pt", weights_only=True)
    model = fs.models.build_model("mlp", synthetic.input_shape, synthetic.num_classes)
    model.load_state_dict(state)


def test_nan_loss_is_a_clear_error(synthetic, tmp_path):
    job = fs.Job(model="mlp", data=synthetic, quiet=True,
                 options={"run.steps": 30, "optimizer.lr": 1e6, "run.out": str(tmp_path)})
    with pytest.raises(fs.UserError, match=r"worker \d: loss (nan|inf) at step \d+, 11 steps "
                                           r"in a row \(run.max_bad_steps = 10\)"):
        job.simulate(workers=2)
    # the lines up to the stop are kept: they show the loss going wrong
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert {row["rank"] for row in rows} == {0, 1} and len(rows) >= 2 * 11


def test_environment_is_recorded(run):
    env = json.loads((run.run_dir / "environment.json").read_text())
    assert env["fastsgd"] == fs.__version__ and env["torch"] == torch.__version__
    assert env["backend"] == "simulated" and len(env["hosts"]) == 1
    assert {"python", "fastsgd_git_commit", "cwd_git_commit", "command"} <= set(env)
    assert env["cpu"] and env["cpu_count"] >= 1  # runs repeat bitwise on one CPU model
    assert "tcp_congestion_control" not in env  # no network in a simulation


def test_evaluation_is_not_training_time(run):
    s = json.loads((run.run_dir / "summary.json").read_text())
    assert s["evaluations"] == 4 and s["eval_time"] > 0
    assert s["time_to_target"] <= s["simulated_time"]
    assert all(e["time"] <= s["simulated_time"] for e in run.evals())


def _simulate(*args, capsys):
    from fastsgd.cli.main import main

    code = main(["simulate", "--quiet", *args])
    out = capsys.readouterr().out
    assert code == 0
    return out.rsplit("run directory  ", 1)[1].strip()


def test_a_rerun_never_overwrites_a_run(tmp_path, capsys):
    options = ["--set", "data.name=synthetic", "--set", "model.name=mlp",
               "--set", "run.steps=3", "--set", "run.workers=2"]
    first = _simulate(*options, "--set", f"run.out={tmp_path / 'a'}", capsys=capsys)
    assert first == str(tmp_path / "a")
    before = (tmp_path / "a" / "metrics.jsonl").read_text()
    assert _simulate(f"{first}/config.toml", capsys=capsys) == f"{first}-2"
    assert _simulate(f"{first}/config.toml", capsys=capsys) == f"{first}-3"
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == before
    # asked for: the same folder, the old run's files replaced
    assert _simulate(f"{first}/config.toml", "--overwrite", capsys=capsys) == first
    assert _simulate(f"{first}/config.toml", "--set", f"run.out={first}",
                     capsys=capsys) == first
    rows = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3 * 2


def test_default_folder_is_strategy_and_time_and_never_reused(tmp_path):
    import re

    from fastsgd.records.rundir import claim, default_out

    assert re.fullmatch(r"runs/dpsgd-\d{8}-\d{6}", default_out("dpsgd"))
    out = str(tmp_path / "runs" / "dpsgd-x")
    first = claim(out, reuse=False)
    (first / "config.toml").write_text("")
    (first / "attempts" / "1").mkdir(parents=True)  # a restarted run's cut lines
    release(first)  # that run ended
    assert claim(out, reuse=False).name == "dpsgd-x-2"
    assert claim(out, reuse=True) == first and not (first / "config.toml").exists()
    assert not (first / "attempts").exists()  # --overwrite: the old run's, gone with it


@pytest.mark.parametrize("reuse, resume", [(True, False), (False, False), (True, True)])
def test_a_run_out_that_cannot_be_a_folder_is_one_line(tmp_path, reuse, resume):
    from fastsgd.records.rundir import claim

    a_file = tmp_path / "ok.toml"
    a_file.write_text("")
    with pytest.raises(fs.UserError, match=r"^run.out = '.*ok.toml/x': cannot make the folder"):
        claim(str(a_file / "x"), reuse, resume)
    if reuse:  # named by the user: that very path, which is a file
        with pytest.raises(fs.UserError, match=r"^run.out = '.*ok.toml': .* is a file, not a"):
            claim(str(a_file), reuse, resume)


@pytest.mark.parametrize("named_by_us", [True, False])
def test_a_failed_run_drops_only_an_empty_folder_of_its_own_naming(tmp_path, named_by_us):
    from fastsgd.records.rundir import dropped_if_empty

    empty, written = tmp_path / "empty", tmp_path / "written"
    for folder in (empty, written):
        folder.mkdir()
        with pytest.raises(fs.UserError), dropped_if_empty(folder, named_by_us):
            if folder is written:
                (folder / "config.toml").write_text("")
            raise fs.UserError("bad input")
    assert empty.exists() != named_by_us and (written / "config.toml").exists()


def test_two_runs_started_at_once_never_share_a_folder(tmp_path):
    """A folder is claimed before any file of its run is written: two runs started in the
    same second (one default name) got the same folder and wrote into each other's files."""
    from fastsgd.records.rundir import claim

    out = str(tmp_path / "runs" / "allreduce-x")
    first = claim(out, reuse=False)  # nothing written in it yet, as right after the claim
    assert claim(out, reuse=False).name == "allreduce-x-2"
    (tmp_path / "by-hand").mkdir()  # an empty folder made by hand is still taken, once
    assert claim(str(tmp_path / "by-hand"), reuse=False) == tmp_path / "by-hand"
    assert claim(str(tmp_path / "by-hand"), reuse=False).name == "by-hand-2"
    assert first == tmp_path / "runs" / "allreduce-x"


def test_many_processes_claim_distinct_folders(tmp_path):
    import multiprocessing as mp

    with mp.get_context("fork").Pool(8) as pool:
        names = pool.map(_claim_name, [str(tmp_path / "same")] * 32)
    assert len(set(names)) == 32


def _claim_name(out: str) -> str:
    from fastsgd.records.rundir import claim

    return str(claim(out, reuse=False))


def test_a_run_directory_has_one_writer_at_a_time(tmp_path):
    hold(tmp_path)
    with pytest.raises(UserError, match=rf"^{tmp_path} is in use by a running fastsgd "
                                        rf"\(process {os.getpid()}\)"):
        claim(str(tmp_path), reuse=True)  # would have removed the running run's files
    release(tmp_path)
    assert claim(str(tmp_path), reuse=False, resume=True) == tmp_path
    release(tmp_path)


@pytest.mark.multiproc
def test_a_second_writer_of_a_running_run_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    sets = ["--set", "data.name=digits", "--set", "model.name=mlp", "--set", "run.workers=2",
            "--set", f"run.out={out}"]
    cli = [sys.executable, "-m", "fastsgd", "run", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([*cli, *sets, "--set", "run.steps=100000",
                              "--set", "run.checkpoint_every=50"],
                             stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.steps(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        for second in ([*cli, "--resume", str(out)], [*cli, *sets, "--set", "run.steps=5"]):
            refused = subprocess.run(second, capture_output=True, text=True, env=env, timeout=120)
            assert refused.returncode == 2
            assert refused.stderr == (f"fastsgd: error: {out} is in use by a running fastsgd "
                                      f"(process {first.pid}): wait for it to end or stop it, "
                                      "or give this run another run.out\n")
        assert first.poll() is None and (out / "config.toml").exists()  # untouched
    finally:
        first.kill()
        first.wait()


@pytest.fixture
def read_only(tmp_path):
    """A run with a checkpoint, in a folder then mounted read-only (root, mount); skipped
    where it cannot be."""
    run = tmp_path / "run"
    fs.Job(options={"data.name": "digits", "model.name": "mlp", "run.workers": 2,
                    "run.steps": 4, "run.checkpoint_every": 2, "run.out": str(run)},
           quiet=True, report=False).simulate()
    (run / "summary.json").unlink()  # as an interrupted run leaves it
    if not shutil.which("mount") or subprocess.run(
            ["mount", "--bind", str(run), str(run)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(run)], check=True)
        yield run
    finally:
        subprocess.run(["umount", str(run)], check=True)


def test_resuming_a_run_in_a_read_only_folder_is_one_line(read_only):
    done = subprocess.run([sys.executable, "-m", "fastsgd", "simulate", "--resume",
                           str(read_only), "--quiet", "--no-report"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2  # the CLI's code for a user's error
    assert done.stderr == (f"fastsgd: error: {read_only}: cannot write in it (Read-only file "
                           "system); a run needs a folder it can write, give it another "
                           "run.out (or copy the run there to resume it)\n")
