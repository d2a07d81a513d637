"""Backend choice: NCCL only where every local worker has a GPU; clear errors otherwise."""

import os
import socket
import subprocess
import sys

import pytest
import torch

from fastsgd.errors import UserError
from fastsgd.testing.ports import free_port
from fastsgd.transport.rendezvous import pick_backend


def test_auto_is_gloo_when_workers_outnumber_gpus(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(torch.cuda.device_count() + 1))
    assert pick_backend("auto") == "gloo"


def test_nccl_without_a_gpu_per_worker_names_the_key(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(torch.cuda.device_count() + 1))
    with pytest.raises(UserError, match=r"run.backend = 'nccl' needs a GPU for each"):
        pick_backend("nccl")


def test_gloo_is_taken_as_asked():
    assert pick_backend("gloo") == "gloo"


def _as_torchrun_worker(addr: str, port: int, rank: int) -> subprocess.CompletedProcess:
    """`fastsgd run` as worker `rank` of 2 of a torchrun job whose rendezvous is addr:port."""
    env = {**os.environ, "MASTER_ADDR": addr, "MASTER_PORT": str(port), "RANK": str(rank),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "fastsgd", "run", "--set", "data.name=digits",
                           "--set", "model.name=mlp", "--set", "run.timeout=3", "--quiet"],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.multiproc
def test_a_busy_rendezvous_port_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _as_torchrun_worker("127.0.0.1", port, rank=0)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"fastsgd: error: the rendezvous port {port} (MASTER_PORT) "
                                   "is busy on 127.0.0.1: another job holds it; choose "
                                   "another port")


@pytest.mark.multiproc
def test_an_unreachable_rendezvous_is_one_line(tmp_path):
    port = free_port()  # nobody listens there
    done = _as_torchrun_worker("127.0.0.1", port, rank=1)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"fastsgd: error: cannot reach the rendezvous at 127.0.0.1:{port} "
        "(MASTER_ADDR:MASTER_PORT) within run.timeout = 3 s")


_USERS_GROUP = """
import torch, torch.distributed as dist
from fastsgd.transport.torch_dist import TorchTransport
dist.init_process_group("gloo")  # the user's own, before fastsgd's transport
t = TorchTransport("gloo")
x = torch.ones(3)
t.all_reduce(x)
t.close()
assert dist.is_initialized(), "close() destroyed the user's default group"
dist.all_reduce(x)  # still usable
dist.destroy_process_group()
TorchTransport("gloo")  # made the default group itself and never closed: atexit does
print("ok")
"""


def test_close_leaves_the_users_default_group_and_runs_at_exit(tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.run([sys.executable, "-c", _USERS_GROUP], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
