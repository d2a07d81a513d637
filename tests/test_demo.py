"""The embedded default (README's first command): LeNet on Fashion-MNIST, 4 worker
processes, all-reduce. One of its eight epochs here, which reaches 84.65% (deterministic:
allreduce on real processes repeats bit for bit; seeds 1 and 2: 84.99% and 84.42%, 2-core
Xeon, 2026-12-08), so at least 83%: a demo that trains a point and a half worse fails. Two
epochs (86.9%, at least 85%) took 27 s of this test's time against 16; the whole demo's
>= 88% is the published figure its own run writes (docs/results/demo_2core-xeon_20261205.md:
89.14%), 190 s of the suite's time spent for seven more epochs of the same arithmetic."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.multiproc
def test_the_demo_trains_reports_and_prints_its_summary(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "fastsgd", "demo", "--quiet", "--set",
                           f"run.out={out}", "--set", "run.epochs=1"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 4 and summary["strategy"] == "allreduce"
    assert summary["epochs"] == 1 and summary["final_accuracy"] >= 0.83, summary
    for shown in ("test accuracy", "training time", "bytes sent", str(out)):
        assert shown in proc.stdout
    assert (out / "report" / "report.html").exists()
