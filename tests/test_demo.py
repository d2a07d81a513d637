"""The embedded default: LeNet on Fashion-MNIST, 4 worker processes, all-reduce, >= 88%."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.multiproc
def test_demo_reaches_88_percent(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "fastsgd", "demo", "--quiet", "--set",
                           f"run.out={out}"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 4 and summary["strategy"] == "allreduce"
    assert summary["final_accuracy"] >= 0.88, summary
    for shown in ("test accuracy", "training time", "bytes sent", str(out)):
        assert shown in proc.stdout
