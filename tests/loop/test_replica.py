"""Replica, the own-loop API: strategies that act on their last step must be told which it is."""

from __future__ import annotations

import warnings

import pytest
import torch

import fastsgd as fs
from fastsgd.strategies import STRATEGIES, capabilities_of
from fastsgd.transport.sim import simulate

STEPS = 3


def own_loop(strategy: str, total_steps: int | None = None, set_later: bool = False):
    """A worker of the user's own loop for STEPS steps; returns its consensus distance."""
    data = fs.data.load_dataset("synthetic")

    def worker(t) -> float:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        replica = fs.Replica(model, t, strategy, total_steps=total_steps)
        if set_later:
            replica.total_steps = STEPS
        shard = fs.data.Shard(data.train_x, data.train_y, 16, t.rank, t.world_size, seed=0)
        for k in range(STEPS):
            x, y = shard.batch(k)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            replica.sync_gradients()
            optimizer.step()
            replica.sync_parameters()
        distance = replica.consensus_distance()
        replica.close()
        return distance

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distances = simulate(2, worker)
    return distances, [str(w.message) for w in caught if "total_steps" in str(w.message)]


def test_localsgd_without_total_steps_warns_once_per_replica():
    distances, caught = own_loop("localsgd")
    assert len(caught) == 2  # one per replica, not one per step
    assert "'localsgd'" in caught[0] and "Replica(..., total_steps=N)" in caught[0]
    assert distances[0] > 0  # the period (8) never ended: no average was taken


@pytest.mark.parametrize("set_later", [False, True])
def test_localsgd_told_total_steps_averages_at_the_end_silently(set_later):
    distances, caught = own_loop("localsgd", None if set_later else STEPS, set_later)
    assert caught == []
    assert distances == [0.0, 0.0]


def test_allreduce_needs_no_total_steps():
    distances, caught = own_loop("allreduce")
    assert caught == [] and distances[0] < 1e-12


def test_the_strategies_that_drain_say_so():
    drains = {name for name in STRATEGIES if capabilities_of(STRATEGIES.get(name)).drains_at_end}
    assert drains == {"localsgd", "easgd", "bmuf", "ssp", "ps", "adpsgd", "sgp", "diloco",
                      "sparseloco", "sparta", "noloco", "async_diloco"}


def test_consensus_distance_is_the_mean_squared_distance_to_the_average():
    """Each worker's parameters set apart by hand: the distance is computed, not assumed."""
    shifts = [0.0, 1.0, 3.0]

    def worker(t) -> float:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        replica = fs.Replica(model, t, "localsgd", total_steps=1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(shifts[t.rank])
        return replica.consensus_distance()

    numel = 4 * 3 + 3 + 3 * 2 + 2
    mean = sum(shifts) / len(shifts)
    expected = numel * sum((s - mean) ** 2 for s in shifts) / len(shifts)
    assert simulate(len(shifts), worker) == pytest.approx([expected] * 3, rel=1e-6)  # float32


def test_a_replica_of_another_architecture_is_named():
    from fastsgd.errors import UserError
    from fastsgd.transport.sim import simulate

    def worker(t):
        width = 8 if t.rank != 2 else 9
        model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
        fs.Replica(model, t, "allreduce")

    with pytest.raises(UserError, match="worker 2's model is not worker 0's"):
        simulate(3, worker)


def test_restored_state_goes_back_where_the_replica_keeps_it():
    # a checkpoint loads on the CPU; a GPU worker's state lives on its GPU ("meta" stands in)
    from fastsgd.loop.replica import _placed_like

    fresh = {"anchor": torch.zeros(3, device="meta"), "edges": [torch.zeros(2, device="meta")]}
    saved = {"anchor": torch.ones(3), "edges": [torch.ones(2)], "late": torch.ones(1), "k": 4}
    placed = _placed_like(saved, fresh, torch.device("meta"))
    assert placed["anchor"].is_meta and placed["edges"][0].is_meta and placed["late"].is_meta
    assert placed["k"] == 4
    assert _placed_like(saved, fresh, torch.device("cpu"))["late"].device.type == "cpu"
