"""Real processes (`fastsgd run`, run.rejoin): a killed worker of sgp, adpsgd, dpsgd, ps or ltfb is
replaced by a new process that joins the running run from a live worker's state, at a step
every worker counts it in from, and trains to the end with the others."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.faults.helpers import assert_joined_from_a_live_state

# 600 steps: on a fast box (1.7 ms a step) a join step set a quarter of a second of steps
# ahead of a worker past step 140 was past step 300, and the loss was not made good
STEPS, KILLED_AT, EVAL_EVERY = 600, 40, 200
JOINED = re.compile(r"fastsgd: worker 2 was killed by signal 9 \(SIGKILL\); a new worker takes "
                    r"its place from step (\d+), with worker 0's state")


def _run(out, strategy="sgp", **env_vars):
    strategy, _, codec = strategy.partition("+")  # e.g. sgp+qsgd: with a lossy codec
    name, _, topology = strategy.partition("-")
    sets = {"data.name": "digits", "model.name": "mlp", "run.workers": 4, "run.steps": STEPS,
            "run.eval_every": EVAL_EVERY, "strategy.name": name, "run.rejoin": "true",
            "run.out": str(out), **({"strategy.topology": topology} if topology else {}),
            **({"compression.name": codec} if codec else {})}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", "--no-report", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env_vars})


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy, late", [("sgp", 0), ("adpsgd", 0), ("dpsgd-ring", 0),
                                            ("ps", 0), ("ltfb", 0), ("dpsgd-ring", 2),
                                            ("sgp+qsgd", 0), ("adpsgd+topk", 0)])
def test_a_killed_worker_is_replaced_by_one_that_joins_from_a_live_state(strategy, late,
                                                                          tmp_path):
    # late: the new process connects 2 s after it started, when the others have gone past
    # the step it joins at; what they sent it meanwhile is held for it
    done = _run(tmp_path, strategy, FASTSGD_TEST_KILL=f"2:{KILLED_AT}",
                FASTSGD_TEST_JOIN_DELAY=str(late))
    assert done.returncode == 0, done.stderr[-3000:]
    match = JOINED.fullmatch(done.stderr.strip())
    assert match, done.stderr
    joined = int(match.group(1))
    assert KILLED_AT < joined < STEPS
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["lost_workers"] == []
    [back] = summary["rejoined_workers"]
    assert (back["worker"], back["left_at_step"], back["joined_at_step"]) == (
        2, KILLED_AT, joined)
    assert summary["final_accuracy"] > 0.85 and summary["evaluations"] == STEPS // EVAL_EVERY
    # sgp, adpsgd and ps end in one model: the joiner's taken in
    if strategy.partition("+")[0] in ("sgp", "adpsgd", "ps"):
        assert summary["consensus_distance"] < 1e-12
    # the new process, from the step it joined at to the end; it takes part (pushes, gossip
    # rounds or tournament rounds go both ways), from the live model
    assert_joined_from_a_live_state(tmp_path, 2, joined, STEPS, since=KILLED_AT)


@pytest.mark.multiproc
def test_rejoin_needs_a_strategy_that_takes_a_new_worker(tmp_path):
    done = _run(tmp_path, strategy="allreduce")
    assert done.returncode == 2
    assert done.stderr.startswith("fastsgd: error: run.rejoin = true needs a strategy")
    assert "strategy 'allreduce'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.multiproc
def test_a_worker_killed_in_its_first_step_is_replaced(tmp_path):
    # its peers were waiting for its exchange of step 0 when its replacement connected:
    # that wait fails (nobody will send it), they close the ring and go on to the join
    done = _run(tmp_path, "dpsgd-ring", FASTSGD_TEST_KILL="2:1:parameters")
    assert done.returncode == 0, done.stderr[-3000:]
    assert JOINED.fullmatch(done.stderr.strip()), done.stderr
    [back] = json.loads((tmp_path / "summary.json").read_text())["rejoined_workers"]
    assert back["left_at_step"] == 0


@pytest.mark.multiproc
def test_a_new_worker_whose_donor_dies_first_is_replaced_from_another(tmp_path):
    done = _run(tmp_path, "dpsgd-ring", FASTSGD_TEST_KILL=f"2:{KILLED_AT}",
                FASTSGD_TEST_KILL_DONOR="0")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert JOINED.fullmatch(lines[0]) and len(lines) == 3, lines
    assert re.fullmatch(r"fastsgd: worker 0 was killed by signal 9 \(SIGKILL\); a new worker "
                        r"takes its place from step \d+, with worker 1's state", lines[1])
    assert re.fullmatch(r"fastsgd: worker 2, a new process, lost the worker it was to take "
                        r"its state from before it had it; a new worker takes its place from "
                        r"step \d+, with worker 1's state", lines[2])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["lost_workers"] == [] and summary["final_accuracy"] > 0.85
    first, second = [r for r in summary["rejoined_workers"] if r["worker"] == 2]
    # (the step after its last message that reached the summary's writer: its sender
    # thread may not have sent all of its last step's before the kill)
    assert KILLED_AT - 1 <= first["left_at_step"] <= KILLED_AT
    assert second["left_at_step"] == first["joined_at_step"] < second["joined_at_step"]
