"""A graph without its lost workers: rings and tori close around the gap, other graphs give
the lost edges' weight back to the worker; the mixing matrix stays doubly stochastic."""

import random

import pytest
import torch

from fastsgd.strategies.membership import await_messages, healed_weights
from fastsgd.topology.build import build_topology
from fastsgd.transport.base import PeerLost


def _matrix(topology, gone):
    n = topology.n
    w = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        if i not in gone:
            for j, weight in healed_weights(topology, i, 0, gone):
                w[i, j] += weight
    return w


def test_a_ring_closes_around_the_gap():
    ring = build_topology("ring", 6)
    assert healed_weights(ring, 1, 0, {2}) == [(0, 1 / 3), (1, 1 / 3), (3, 1 / 3)]
    assert healed_weights(ring, 3, 0, {2}) == [(1, 1 / 3), (3, 1 / 3), (4, 1 / 3)]
    assert healed_weights(ring, 1, 0, {2, 3}) == [(0, 1 / 3), (1, 1 / 3), (4, 1 / 3)]
    assert healed_weights(ring, 0, 0, {2}) == ring.weights(0)  # not next to the gap


def test_a_torus_closes_each_row_and_column():
    torus = build_topology("torus", 16, rows=4, cols=4)  # rank = 4 * row + col
    peers = [p for p, _ in healed_weights(torus, 4, 0, {5, 8})]
    assert peers == [0, 4, 6, 7, 12]  # right: 5 lost -> 6; down: 8 lost -> 12; left wraps to 7


@pytest.mark.parametrize("name, n", [("ring", 9), ("torus", 12), ("exponential", 8),
                                     ("complete", 5), ("hypercube", 8)])
def test_without_any_lost_workers_w_stays_doubly_stochastic(name, n):
    topology = build_topology(name, n)
    draw = random.Random(n)
    for _ in range(20):
        gone = set(draw.sample(range(n), draw.randint(1, n - 2)))
        w = _matrix(topology, gone)
        live = [i for i in range(n) if i not in gone]
        sub = w[live][:, live]
        assert torch.allclose(sub, sub.T)
        assert torch.allclose(sub.sum(1), torch.ones(len(live), dtype=torch.float64))
        assert float(w[:, sorted(gone)].abs().sum()) == 0  # no weight on a lost worker


class _Messages:
    """Five messages, and a peer found lost after the second."""

    def __init__(self):
        self.calls = 0

    def wait_message(self, tag):
        self.calls += 1
        if self.calls == 3:
            raise PeerLost([2])
        return (1, torch.zeros(1))


def test_the_messages_due_are_counted_again_only_when_a_peer_is_lost():
    # sgp's count walks the whole run against the roster: asked after every message, a
    # drain after many rejoins took minutes (a soak, 2026-11-28)
    asked = []

    def due():
        asked.append(1)
        return 5 if len(asked) == 1 else 4  # the lost peer's last message will not come

    arrived = await_messages(_Messages(), 21, due)
    assert len(arrived) == 4 and len(asked) == 2
