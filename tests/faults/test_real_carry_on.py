"""Real processes (`fastsgd run`): a worker of ps, adpsgd, sgp or ltfb is killed (-9)
halfway; the survivors notice at once (its connection ends), carry on without it and
finish, and the summary lists the lost worker."""

import json
import os
import subprocess
import sys

import pytest

STEPS, KILLED_AT = 120, 60
COMMON = {"data.name": "digits", "model.name": "mlp", "run.workers": 4,
          "run.steps": STEPS, "run.eval_every": 40}


def _run(out, strategy, **env_vars):
    sets = {**COMMON, "strategy.name": strategy, "run.out": str(out)}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env_vars})


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy", ["sgp", "adpsgd", "ps", "ltfb"])
def test_the_survivors_carry_on_without_a_killed_worker(strategy, tmp_path):
    done = _run(tmp_path, strategy, FASTSGD_TEST_KILL=f"2:{KILLED_AT}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.strip() == ("fastsgd: worker 2 was killed by signal 9 (SIGKILL); "
                                   "the others carry on without it")
    summary = json.loads((tmp_path / "summary.json").read_text())
    [lost] = summary["lost_workers"]
    assert lost["worker"] == 2 and lost["step"] == KILLED_AT  # it had done KILLED_AT steps
    assert summary["final_accuracy"] > 0.85 and summary["steps"] == STEPS
    ranks = {json.loads(line)["rank"] for line in (tmp_path / "metrics.jsonl").open()
             if json.loads(line)["step"] > KILLED_AT + 10}
    assert ranks == {0, 1, 3}  # the survivors went on to the end
