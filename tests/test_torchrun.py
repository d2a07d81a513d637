"""The same script runs under torchrun (env:// rendezvous), one worker per process."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastsgd.launch import free_port
from tests.conftest import max_abs_diff, reference_sgd

SCRIPT = Path(__file__).parent / "scripts" / "torchrun_train.py"


def torchrun() -> list[str]:
    beside_python = Path(sys.executable).parent / "torchrun"
    found = str(beside_python) if beside_python.exists() else shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["job", "replica"])
def test_torchrun_four_processes(mode, tmp_path, synthetic):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*torchrun(), "--nnodes", "1", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(SCRIPT), str(tmp_path / "out"), mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = torch.load(tmp_path / "out" / "model.pt", weights_only=True)
    assert max_abs_diff(params, reference_sgd(synthetic, batch_size=64, steps=50)) < 1e-4
    if mode == "job":
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        assert summary["workers"] == 4 and summary["mode"] == "real"
