"""`fastsgd join RUN_DIR` (run.join): a process started from outside the launcher waits at the
run's door and takes a lost worker's place from a live worker's state; a second one waits
behind it and leaves when the run ends. And what `fastsgd join` refuses, in one line."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

import fastsgd as fs
from fastsgd.control.interrupt import Stop
from fastsgd.control.slots import Slots
from fastsgd.errors import UserError
from tests.faults.helpers import assert_joined_from_a_live_state

STEPS, KILLED_AT = 450, 40
# each step sleeps 7 of its compute: about 9 s in all, time enough for the joiners to start
# (the second was let in at step 136 to 165, quiet or beside 7 busy processes, 2026-12-08: the
# sleeps stretch with the compute as the joiners' start-up does); 900 steps waited 10 s more
SLOW = "[8, 8, 8, 8]"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _fastsgd(*args, **env):
    return subprocess.Popen([sys.executable, "-m", "fastsgd", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**ENV, **env})


def _sets(out, **more):
    sets = {"data.name": "digits", "model.name": "mlp", "run.workers": 4, "run.steps": STEPS,
            "run.eval_every": 0, "strategy.name": "sgp", "run.join": "true",
            "run.out": str(out), **more}
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def _wait_for(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)


@pytest.mark.multiproc
def test_processes_from_outside_take_a_lost_workers_place_one_after_another(tmp_path):
    run = _fastsgd("run", "--quiet", "--no-report", *_sets(tmp_path, **{"compute.slowdown": SLOW}),
                   FASTSGD_TEST_KILL=f"2:{KILLED_AT}")
    _wait_for(tmp_path / ".door")
    joiners = {j.pid: j for j in (_fastsgd("join", "--quiet", str(tmp_path)) for _ in range(3))}
    # the first one let in is killed once it has done a step; the next one at the door
    # takes its place (the third waits behind it, and leaves when the run ends)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(run.stderr), daemon=True)
    reader.start()
    door = Stop.attach(tmp_path / ".door")
    deadline = time.monotonic() + 120
    while not (len(lines) > 1 and door.progress[2] > door.joined_at[2]):
        assert time.monotonic() < deadline and run.poll() is None, ("no one let in", lines)
        time.sleep(0.01)
    first = _let_in(lines[1])[0]
    joiners[first].kill()
    run.wait(timeout=300)
    reader.join(timeout=60)
    ends = {pid: j.communicate(timeout=60) for pid, j in joiners.items()}
    lines = [line.rstrip("\n") for line in lines]
    assert run.returncode == 0, lines
    assert len(lines) == 4, lines
    assert lines[0] == ("fastsgd: worker 2 was killed by signal 9 (SIGKILL); the others carry "
                        "on without it")
    first_in, then_in = _let_in(lines[1]), _let_in(lines[3])
    assert first_in[0] == first and then_in[0] != first
    assert lines[2] == ("fastsgd: worker 2, a process of fastsgd join, ended without telling "
                        "how (killed?); the others carry on without it")
    assert KILLED_AT < first_in[1] < then_in[1] < STEPS
    assert joiners[first].returncode == -9
    second = then_in[0]
    assert joiners[second].returncode == 0, ends[second]
    assert ends[second][1].strip().endswith("worker 2 trained to the end of the run")
    [third] = set(joiners) - {first, second}
    assert joiners[third].returncode == 0, ends[third]
    assert ends[third][1].strip().endswith(f"the run in {tmp_path} ended before a place came "
                                           "free")
    _check_the_run(tmp_path, then_in[1])
    assert not (tmp_path / ".door").exists()  # the door is closed and gone


def _let_in(line):
    match = re.fullmatch(r"fastsgd: process (\d+) \(fastsgd join\) takes worker 2's place "
                         r"from step (\d+), with worker \d's state", line.strip())
    assert match, line
    return int(match.group(1)), int(match.group(2))


def _check_the_run(out, joined):
    """The last process let in trained from its step to the end, from the live model."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lost_workers"] == [] and summary["consensus_distance"] < 1e-12
    assert summary["final_accuracy"] > 0.85
    assert [b["worker"] for b in summary["rejoined_workers"]] == [2, 2]
    assert summary["rejoined_workers"][-1]["joined_at_step"] == joined
    assert_joined_from_a_live_state(out, 2, joined, STEPS, since=joined)


def _one_line_error(done, *parts):
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for part in parts:
        assert part in done.stderr, done.stderr


def test_join_refuses_a_folder_without_a_running_run(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fastsgd", "join", str(tmp_path)],
                          capture_output=True, text=True, env=ENV, timeout=120)
    _one_line_error(done, f"{tmp_path}: no run there takes new workers now",
                    "run.join = true")
    # a door its launcher left behind (killed -9): the run is not running any more
    slots = Slots(4, tmp_path / ".door")
    dead = subprocess.Popen(["true"])
    dead.wait()
    slots["pid"] = dead.pid
    done = subprocess.run([sys.executable, "-m", "fastsgd", "join", str(tmp_path)],
                          capture_output=True, text=True, env=ENV, timeout=120)
    _one_line_error(done, f"the run in {tmp_path} is not running any more",
                    f"pid {dead.pid}")
    (tmp_path / ".door").write_bytes(b"not a door")
    done = subprocess.run([sys.executable, "-m", "fastsgd", "join", str(tmp_path)],
                          capture_output=True, text=True, env=ENV, timeout=120)
    _one_line_error(done, "is not the door of a fastsgd run")


@pytest.mark.parametrize("command, sets, expected", [
    ("run", {"strategy.name": "allreduce"}, "run.join = true needs a strategy that carries on"),
    ("simulate", {}, "not into the simulator: run.rejoin = true starts new workers"),
])
def test_run_join_where_it_cannot_be(tmp_path, command, sets, expected):
    done = subprocess.run([sys.executable, "-m", "fastsgd", command, "--quiet", "--no-report",
                           *_sets(tmp_path / "run", **sets)],
                          capture_output=True, text=True, env=ENV, timeout=120)
    _one_line_error(done, expected)


@pytest.mark.parametrize("key", ["join", "rejoin"])
def test_joining_an_nccl_group_is_one_line(tmp_path, monkeypatch, key):
    """An NCCL group cannot take a new member: refused before a worker starts (as if this
    machine had a GPU per worker; none is started)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    job = fs.Job(model="mlp", data="digits", strategy="sgp", quiet=True,
                 options={"run.steps": 3, f"run.{key}": True, "run.backend": "nccl",
                          "run.out": str(tmp_path)})
    with pytest.raises(UserError, match=rf"^run.{key} = true needs run.backend = 'gloo'"):
        job.run(workers=2)
