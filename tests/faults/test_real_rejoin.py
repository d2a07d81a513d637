"""Real processes (`fastsgd run`, run.rejoin): a killed worker of sgp, dpsgd or ps is
replaced by a new process that joins the running run from a live worker's state, at a step
every worker counts it in from, and trains to the end with the others."""

import json
import os
import re
import subprocess
import sys

import pytest

from fastsgd.transport.roster import Roster

STEPS, KILLED_AT, EVAL_EVERY = 300, 40, 100
JOINED = re.compile(r"fastsgd: worker 2 was killed by signal 9 \(SIGKILL\); a new worker takes "
                    r"its place from step (\d+), with worker 0's state")


def _run(out, strategy="sgp", **env_vars):
    name, _, topology = strategy.partition("-")
    sets = {"data.name": "digits", "model.name": "mlp", "run.workers": 4, "run.steps": STEPS,
            "run.eval_every": EVAL_EVERY, "strategy.name": name, "run.rejoin": "true",
            "run.out": str(out), **({"strategy.topology": topology} if topology else {})}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env_vars})


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy, late", [("sgp", 0), ("dpsgd-ring", 0), ("ps", 0),
                                            ("sgp", 2), ("dpsgd-ring", 2)])
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
    if strategy != "dpsgd-ring":  # they end in one model: the joiner's taken in
        assert summary["consensus_distance"] < 1e-12
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    # the new process, from the step it joined at to the end (the killed one's last lines,
    # not yet flushed, died with it)
    assert [r["step"] for r in rows if r["rank"] == 2 and r["step"] > KILLED_AT] == [
        *range(joined + 1, STEPS + 1)]
    first = next(r for r in rows if r["rank"] == 2 and r["step"] == joined + 1)
    # a fresh MLP's loss on digits is about 2.3: the new worker started from the live model
    fresh = next(r for r in rows if r["rank"] == 0 and r["step"] == 1)
    assert first["loss"] < 0.5 < fresh["loss"]


@pytest.mark.multiproc
def test_rejoin_needs_a_strategy_that_takes_a_new_worker(tmp_path):
    done = _run(tmp_path, strategy="allreduce")
    assert done.returncode == 2
    assert done.stderr.startswith("fastsgd: error: run.rejoin = true needs a strategy")
    assert "strategy 'allreduce'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_roster_counts_a_lost_worker_out_until_its_replacement_joins():
    roster = Roster()
    own = {2: [(40, 1.0)]}
    assert roster.absent(own, 39) == set() and roster.absent(own, 40) == {2}
    roster.note_returns([0, 0, 60, 0])
    assert roster.absent(own, 59) == {2} and roster.absent(own, 60) == set()
    roster.note_returns([0, 0, 60, 0])  # read again every step: recorded once
    # the replacement is lost before it sent anything: it left at the step it joined at
    own[2].append((0, 2.0))
    assert roster.absent(own, 59) == {2} and roster.absent(own, 61) == {2}
    roster.note_returns([0, 0, 90, 0])
    assert roster.absent(own, 89) == {2} and roster.absent(own, 90) == set()
    # a joiner learns what happened before it existed from its donor
    joiner = Roster()
    joiner.load(roster.state({**own, 3: [(10, 0.5)]}))
    assert joiner.absent({}, 50) == {2, 3} and joiner.absent({}, 95) == {3}
