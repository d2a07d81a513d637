"""The network model's formulas (docs/simulator.md), checked to the nanosecond, and loss."""

import pytest
import torch

from fastsgd.transport.frames import frame_bytes
from fastsgd.transport.sim import ComputeModel, Network, simulate
from fastsgd.transport.sim.compute import to_ns
from tests.strategies.helpers import sim_job

FREE = ComputeModel.free()
S = 100_000  # bytes: 25,000 float32
B, L = 100e6 / 8, 2e-3  # 100 Mbit/s, 2 ms
NET = Network.parse("100Mbit", "2ms", mtu=0)  # the formulas in payload bytes


def _clock_after(world, fn, net=NET):
    return simulate(world, fn, net, FREE)


def _allreduce(t):
    t.all_reduce(torch.ones(S // 4))
    return round(t.now() * 1e9)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_ring_allreduce(n):
    expected = to_ns(2 * (n - 1) / n * S / B + 2 * (n - 1) * L)
    assert _clock_after(n, _allreduce) == [expected] * n


def test_hierarchical_allreduce_over_nodes():
    g, m = 4, 2  # 8 workers, 2 nodes
    net = Network.parse("100Mbit", "2ms", workers_per_node=g, intra_bandwidth="10Gbit",
                        intra_latency="5us", mtu=0)
    bi, li = 10e9 / 8, 5e-6
    inside = S / bi + (g - 1) * li
    expected = to_ns(2 * inside + 2 * (m - 1) / m * S / B + 2 * (m - 1) * L)
    assert _clock_after(g * m, _allreduce, net) == [expected] * (g * m)


def test_incast_at_a_server():
    """n pushes of S bytes sent at once reach the server after about n*S/B (its downlink)."""
    push = torch.zeros(S // 4)

    def worker(t):
        t.start_messages()
        if t.rank:
            t.post(push, 0, tag=7)
            return None
        for _ in range(t.world_size - 1):
            t.wait_message(7)
        return round(t.now() * 1e9)

    size = frame_bytes(push)  # the payload and its frame header
    for n in (2, 5):
        assert _clock_after(n, worker)[0] == to_ns(size / B) * (n - 1) + to_ns(L)


def test_gossip_with_d_neighbours_pays_d_transfers():
    def worker(t):
        peers = [(t.rank + k) % t.world_size for k in (1, 2)]
        senders = [(t.rank - k) % t.world_size for k in (1, 2)]
        t.exchange([(p, torch.ones(S // 4)) for p in peers], senders, torch.empty(S // 4))
        return round(t.now() * 1e9)

    assert _clock_after(5, worker) == [2 * to_ns(S / B) + to_ns(L)] * 5


def test_a_slow_nic_limits_what_it_receives():
    net = Network.parse("100Mbit", "2ms", bandwidths={"1": "10Mbit"}, mtu=0)

    def worker(t):
        if t.rank == 0:
            t.send(torch.zeros(S // 4), 1)
            return None
        t.recv(torch.empty(S // 4), 0)
        return round(t.now() * 1e9)

    assert _clock_after(2, worker, net)[1] == to_ns(S / (10e6 / 8)) + to_ns(L)


def test_ethernet_frames_carry_headers():
    """With an MTU, each frame of up to 1448 payload bytes carries 66 bytes of headers."""
    net = Network.parse("100Mbit", "2ms", mtu=1500)
    frames = -(-S // 1448)
    assert net.wire(S) == S + 66 * frames
    assert _clock_after(2, _allreduce, net) == [to_ns(2 * (S / 2 + 66 * 35) / B + 2 * L)] * 2


def test_reliable_messages_come_late_and_droppable_ones_may_not_come():
    net = Network.parse("100Mbit", "2ms", loss=0.5, rto="100ms", seed=4)

    def worker(t):
        t.start_messages()
        if t.rank == 0:
            for k in range(40):
                t.post(torch.full((1,), float(k)), 1, tag=3)
                t.post(torch.full((1,), float(k)), 1, tag=4, droppable=True)
            t.barrier()
            return None
        got = [t.wait_message(3) for _ in range(40)]
        late = round(t.now() * 1e9)
        t.barrier()
        return [float(m[1][0]) for m in got], len(t.poll(4)), late

    _, (reliable, droppable, late) = _clock_after(2, worker, net)
    assert sorted(reliable) == [float(k) for k in range(40)]
    assert 5 < droppable < 35  # about half were lost for good
    assert late >= to_ns(0.1)  # someone waited for a retransmission


@pytest.mark.parametrize("name", ["ps", "sgp", "adpsgd"])
def test_asynchronous_strategies_train_on_a_lossy_network(name, synthetic, tmp_path):
    """5% of messages lost: ps skips lost pushes, sgp and adpsgd wait for retransmissions
    (docs/strategies.md). Chance is 0.1; the synchronous settings (lr 0.05, momentum 0.9:
    ps adapts them, docs/strategies.md)."""
    job = sim_job(synthetic, tmp_path, {"name": name}, steps=200,
                  **{"network.loss": 0.05, "network.rto": "20ms", "network.latency": "1ms",
                     "compute.step_time": "2ms"})
    assert job.simulate(workers=4).accuracy > 0.5
