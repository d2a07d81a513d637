"""The network model's formulas (docs/simulator.md), checked to the nanosecond, and loss."""

import pytest
import torch

from fastsgd.transport.frames import frame_bytes
from fastsgd.transport.sim import ComputeModel, Network, simulate
from fastsgd.transport.sim.compute import PHASES, to_ns
from fastsgd.transport.sim.trace import Trace, Window
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


ONE_NODE = dict(workers_per_node=4, intra_bandwidth="10Gbit", intra_latency="5us", mtu=0)


def _times(t, kinds=("allreduce", "allgather", "broadcast"), rounds=8):
    """How long each of `rounds` collectives of each kind takes (ns), then a message 0 -> 1."""
    out, tensor = [], torch.ones(S // 4)
    for _ in range(rounds):
        for kind in kinds:
            began = t.now_ns()
            {"allreduce": lambda: t.all_reduce(tensor), "allgather": lambda: t.all_gather(tensor),
             "broadcast": lambda: t.broadcast(tensor, src=0)}[kind]()
            out.append(t.now_ns() - began)
    if t.rank < 2:
        began = t.now_ns()
        t.send(tensor, 1) if t.rank == 0 else t.recv(torch.empty(S // 4), 0)
        out.append(t.now_ns() - began)
    return out


@pytest.mark.parametrize("key", [{"loss": 0.5}, {"jitter": "1s"}])
def test_inside_a_node_nothing_is_lost_or_jittered(key):
    """One node of 4: no round of any collective, nor a message, crosses a network."""
    net = Network.parse("100Mbit", "2ms", **ONE_NODE, **key)
    clean = Network.parse("100Mbit", "2ms", **ONE_NODE)
    assert _clock_after(4, _times, net) == _clock_after(4, _times, clean)
    assert _clock_after(4, _times, clean)[0][:3] == [
        to_ns(2 * (S / (10e9 / 8) + 3 * 5e-6)), to_ns(3 * (5e-6 + S / (10e9 / 8))),
        to_ns(2 * (5e-6 + S / (10e9 / 8)))]


def test_the_hierarchical_all_reduce_loses_only_across_nodes():
    """Two nodes of 2, loss 0.5: the ring across the nodes (2 rounds of 2 messages) waits
    for whole retransmission timeouts; the phases inside the nodes lose nothing."""
    net = Network.parse("100Mbit", "2ms", loss=0.5, rto="100ms", seed=1,
                        **{**ONE_NODE, "workers_per_node": 2})
    clean = Network.parse("100Mbit", "2ms", **{**ONE_NODE, "workers_per_node": 2})
    lossy = _clock_after(4, lambda t: _times(t, ("allreduce",), 20), net)[2]
    base = _clock_after(4, lambda t: _times(t, ("allreduce",), 1), clean)[2][0]
    extra = [(d - base) / to_ns(0.1) for d in lossy]
    assert set(extra) <= {0, 1, 2} and 1 in extra and 2 in extra


def test_jitter_delays_each_round_of_a_collective_between_nodes():
    """2 nodes: each of the ring's 2 rounds waits for its slower message's jitter, drawn from
    the seeded stream: the same delays again, other ones with another seed."""
    def run(seed):
        net = Network.parse("100Mbit", "2ms", jitter="10ms", seed=seed, mtu=0)
        return _clock_after(2, lambda t: _times(t, ("allreduce",), 20), net)[0]

    ring = to_ns(2 * (1 / 2) * S / B + 2 * L)
    delays = [d - ring for d in run(3)[:-1]]  # (the last: a send)
    assert all(0 <= d <= to_ns(0.02) for d in delays) and len(set(delays)) == len(delays)
    assert sum(delays) / len(delays) > to_ns(0.01)  # a round waits for the larger of 2
    assert run(3) == run(3) != run(4)


def test_a_collective_is_priced_at_the_trace_bandwidth_when_it_starts():
    """Worker 1's NIC is 10 Mbit/s for the first 100 ms (a trace window), then the network's."""
    always = 10 ** 18
    trace = Trace("t", {0: (Window(0, always, 1.0, None),),
                        1: (Window(0, 10 ** 8, 1.0, 10e6 / 8), Window(10 ** 8, always, 1.0, None))})
    compute = ComputeModel("fixed", dict.fromkeys(PHASES, 0), trace=trace)

    def worker(t):
        first = _allreduce(t)
        t.scheduler.charge(t.rank, to_ns(0.2) - first)
        return first, _allreduce(t) - to_ns(0.2)

    assert simulate(2, worker, NET, compute) == [
        (to_ns(S / (10e6 / 8) + 2 * L), to_ns(S / B + 2 * L))] * 2


@pytest.mark.parametrize("per_node", [1, 2, 4])
def test_a_hierarchical_all_reduce_counts_what_each_worker_sends(per_node):
    """8 workers, per_node to a node, one all-reduce of 4000 bytes: a chain inside each node
    to its lowest rank and back, a ring among those; each worker counts its part, and the
    total is a flat ring's (issue 51, item 3)."""
    size = 4000
    net = Network.parse("1Gbit", "1ms", workers_per_node=per_node, intra_bandwidth="10Gbit")

    def worker(t):
        t.all_reduce(torch.ones(size // 4))
        return t.bytes_sent, t.bytes_received

    counted = simulate(8, worker, net)
    leaders, g = 8 // per_node, per_node
    ring = 2 * (leaders - 1) * size // leaders
    expected = [ring + size * (g > 1) if r % g == 0 else size * (1 + (r % g < g - 1))
                for r in range(8)]
    assert [sent for sent, _ in counted] == expected
    assert [received for _, received in counted] == expected
    assert sum(expected) == 2 * 7 * size  # what a flat ring over the 8 moves
