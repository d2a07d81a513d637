"""The NCCL/CUDA path: a worker on a GPU trains over NCCL, agrees with the CPU, resumes
bitwise after kill -9, and refuses what host memory alone can do. These need a CUDA device;
CI has none, so they skip there and run where a GPU is (docs/multihost.md, "On GPUs")."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastsgd as fs

pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(
    torch.cuda.device_count() == 0, reason="no CUDA device: the NCCL path needs a GPU")]

COMMON = {"data.name": "digits", "model.name": "mlp", "run.workers": 1, "run.steps": 100}


def _run(out: Path, *sets: str, kill: int | None = None) -> subprocess.CompletedProcess:
    options = {**COMMON, "run.out": str(out)}
    args = [a for k, v in options.items() for a in ("--set", f"{k}={v}")]
    args += [a for item in sets for a in ("--set", item)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kill is not None:
        env["FASTSGD_TEST_KILL_AFTER_CHECKPOINT"] = str(kill)
    return subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def _model(run_dir: Path) -> dict[str, torch.Tensor]:
    model = torch.load(run_dir / "model.pt", weights_only=True)
    assert all(t.device.type == "cpu" for t in model.values())  # loads on a CPU-only machine
    return model


def test_one_gpu_worker_picks_nccl_and_matches_the_cpu(tmp_path):
    gpu = _run(tmp_path / "gpu")
    assert gpu.returncode == 0, gpu.stderr[-3000:]
    recorded = json.loads((tmp_path / "gpu" / "environment.json").read_text())
    assert recorded["backend"] == "nccl" and recorded["cuda"]
    cpu = _run(tmp_path / "cpu", "run.backend=gloo")
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    # GPU kernels round differently, and 100 steps of momentum SGD grow that; they agree
    # to the first steps' rounding and end at the same accuracy
    on = {d: json.loads((tmp_path / d / "summary.json").read_text()) for d in ("gpu", "cpu")}
    assert on["gpu"]["final_accuracy"] > 0.8
    assert abs(on["gpu"]["final_accuracy"] - on["cpu"]["final_accuracy"]) < 0.02, on
    first = {d: fs.Result(None, tmp_path / d).metrics()[0]["loss"] for d in ("gpu", "cpu")}
    assert abs(first["gpu"] - first["cpu"]) < 1e-5, first


@pytest.mark.parametrize("strategy,codec,precision", [
    ("allreduce", "none", "fp32"), ("localsgd", "topk", "fp32"),
    ("allreduce", "none", "fp16")])  # fp16: the loss scale is in the checkpoint
def test_a_gpu_run_resumes_bitwise_after_kill_9(tmp_path, strategy, codec, precision):
    sets = ("run.checkpoint_every=50", f"strategy.name={strategy}", f"compression.name={codec}",
            f"run.precision={precision}")
    straight = _run(tmp_path / "a", *sets)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run(tmp_path / "b", *sets, "run.on_failure=stop", kill=50)
    assert killed.returncode == 1 and "Traceback" not in killed.stderr, killed.stderr[-3000:]
    resumed = subprocess.run([sys.executable, "-m", "fastsgd", "run", "--resume",
                              str(tmp_path / "b"), "--quiet"], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = _model(tmp_path / "a"), _model(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_shared_memory_under_nccl_is_one_line(tmp_path):
    done = _run(tmp_path / "h", "strategy.name=hogwild", "run.backend=nccl")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "shared memory" in done.stderr


def test_hogwild_keeps_to_gloo_where_auto_would_pick_nccl(tmp_path):
    done = _run(tmp_path / "h", "strategy.name=hogwild", "run.steps=20")
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = json.loads((tmp_path / "h" / "environment.json").read_text())
    assert recorded["backend"] == "gloo"
