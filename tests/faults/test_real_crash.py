"""Real processes (`fastsgd run`, run.on_failure = "restart"): a worker killed (-9) at any
point of a step: between steps, mid-collective, before or after its peers' sends, while it
writes a checkpoint; or one that is merely slow. Every worker starts again from the newest
checkpoint (or from the start), and the run ends with the bits of the run that never
failed: nothing lost, nothing counted twice."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from fastsgd.records import checkpoint

COMMON = {"data.name": "digits", "model.name": "mlp", "run.workers": 3, "run.steps": 60,
          "run.checkpoint_every": 20, "run.on_failure": "restart"}
KILLS = {  # id: (strategy, FASTSGD_TEST_KILL, checkpoint_every, the step restarted from)
    "allreduce-between-steps": ("allreduce", "1:37", 20, 20),
    "allreduce-between-steps-no-checkpoint": ("allreduce", "1:37", 0, 0),
    "allreduce-mid-collective": ("allreduce", "1:37:gradients", 20, 20),
    "allreduce-after-the-collective": ("allreduce", "1:37:parameters", 20, 20),
    "dpsgd-before-its-sends": ("dpsgd", "1:37:gradients", 20, 20),
    "dpsgd-after-its-peers-sends": ("dpsgd", "1:37:parameters", 20, 20),
    "dpsgd-during-a-checkpoint-write": ("dpsgd", "1:40:checkpoint", 20, 20),
}


def _run(out, strategy, every=20, extra=(), **env_vars):
    sets = {**COMMON, "strategy.name": strategy, "run.checkpoint_every": every,
            "run.out": str(out)}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    args += [a for item in extra for a in ("--set", item)]
    return subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", "--no-report", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env_vars})


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The run that never failed, once per (strategy, checkpoint interval)."""
    done = {}

    def get(strategy, every):
        if (strategy, every) not in done:
            out = tmp_path_factory.mktemp(f"{strategy}-{every}")
            proc = _run(out, strategy, every)
            assert proc.returncode == 0, proc.stderr[-3000:]
            done[(strategy, every)] = out
        return done[(strategy, every)]
    return get


def _same_bits(a, b):
    ma = torch.load(a / "model.pt", weights_only=True)
    mb = torch.load(b / "model.pt", weights_only=True)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    losses = [sorted((r["step"], r["rank"], r["loss"], r["bytes_sent"])
                     for r in map(json.loads, (d / "metrics.jsonl").open())) for d in (a, b)]
    assert losses[0] == losses[1]  # every step logged once, with the same loss and bytes


@pytest.mark.multiproc
@pytest.mark.parametrize("case", list(KILLS))
def test_a_killed_worker_costs_nothing_but_time(case, straight, tmp_path):
    strategy, kill, every, restart_step = KILLS[case]
    failed = _run(tmp_path, strategy, every, FASTSGD_TEST_KILL=kill)
    assert failed.returncode == 0, failed.stderr[-3000:]
    start = (f"the checkpoint of step {restart_step}" if restart_step
             else "the start (no checkpoint)")
    assert failed.stderr.strip() == ("fastsgd: worker 1 was killed by signal 9 (SIGKILL); "
                                     f"restarting every worker from {start} (restart 1 of 3)")
    _same_bits(straight(strategy, every), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [f["from_step"] for f in summary["failures"]] == [restart_step]
    if every:
        assert checkpoint.steps(tmp_path) == [40, 60]


@pytest.mark.multiproc
def test_a_slow_sender_changes_no_bit(straight, tmp_path):
    """Worker 1 computes 4x slower (compute.slowdown): the others wait for it, nothing else."""
    slow = _run(tmp_path, "dpsgd", extra=["compute.slowdown=[1, 4, 1]"])
    assert slow.returncode == 0, slow.stderr[-3000:]
    _same_bits(straight("dpsgd", 20), tmp_path)


@pytest.mark.multiproc
def test_a_resumed_run_still_tells_the_restarts_before_it(tmp_path):
    """A run restarted once, then interrupted after its checkpoint of step 40 (as if): the
    resume's summary tells the restart of the process before it (failures.json)."""
    assert _run(tmp_path, "allreduce", FASTSGD_TEST_KILL="1:27").returncode == 0
    first = json.loads((tmp_path / "summary.json").read_text())["failures"]
    for name in ("summary.json", "model.pt"):  # what an interrupted run leaves
        (tmp_path / name).unlink()
    checkpoint.cut_back(tmp_path, 40)
    shutil.rmtree(checkpoint.step_dir(tmp_path, 60))
    resumed = subprocess.run([sys.executable, "-m", "fastsgd", "run", "--resume",
                              str(tmp_path), "--quiet", "--no-report"], capture_output=True,
                             text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failures"] == first and [f["from_step"] for f in first] == [20]


@pytest.mark.multiproc
def test_a_resumed_run_still_tells_the_workers_it_lost_before(tmp_path):
    """A worker killed at step 27, the survivors shrink and checkpoint at 40 and 60; the run
    interrupted after 40 (as if) and resumed: its summary still names the lost worker."""
    done = _run(tmp_path, "allreduce", extra=["run.on_failure=shrink"],
                FASTSGD_TEST_KILL="2:27")
    assert done.returncode == 0, done.stderr[-3000:]
    lost = json.loads((tmp_path / "summary.json").read_text())["lost_workers"]
    assert [w["worker"] for w in lost] == [2]
    for name in ("summary.json", "model.pt"):
        (tmp_path / name).unlink()
    shutil.rmtree(checkpoint.step_dir(tmp_path, 60))
    resumed = subprocess.run([sys.executable, "-m", "fastsgd", "run", "--resume",
                              str(tmp_path), "--quiet", "--no-report"], capture_output=True,
                             text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["lost_workers"] == lost
