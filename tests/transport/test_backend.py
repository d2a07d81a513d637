"""Backend choice: NCCL only where every local worker has a GPU; clear errors otherwise."""

import pytest
import torch

from fastsgd.errors import UserError
from fastsgd.transport.torch_dist import pick_backend


def test_auto_is_gloo_when_workers_outnumber_gpus(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(torch.cuda.device_count() + 1))
    assert pick_backend("auto") == "gloo"


def test_nccl_without_a_gpu_per_worker_names_the_key(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(torch.cuda.device_count() + 1))
    with pytest.raises(UserError, match=r"run.backend = 'nccl' needs a GPU for each"):
        pick_backend("nccl")


def test_gloo_is_taken_as_asked():
    assert pick_backend("gloo") == "gloo"
