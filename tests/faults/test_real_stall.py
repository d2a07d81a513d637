"""Real processes: a worker that stalls (SIGSTOP: alive, its connections open, silent) does
not hang its peers for ever: their collective waits run.timeout, then the run ends in one
line that says so, and no process is left behind."""

import os
import subprocess
import sys
import time

import pytest

TIMEOUT = 4


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy", ["allreduce", "localsgd", "dpsgd"])
def test_a_stalled_worker_ends_the_run_after_run_timeout_in_one_line(strategy, tmp_path):
    sets = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 400,
            "run.timeout": TIMEOUT, "strategy.name": strategy, "run.out": str(tmp_path / "r")}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    began = time.monotonic()
    ended = subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", "--no-report",
                            *args], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "OMP_NUM_THREADS": "1",
                                "FASTSGD_TEST_STOP": "1:5"})
    assert ended.returncode != 0
    lines = ended.stderr.strip().splitlines()
    assert len(lines) == 1 and f"worker 0 waited run.timeout = {TIMEOUT} s" in lines[0], lines
    assert time.monotonic() - began < 60
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout  # the stopped worker is gone too
