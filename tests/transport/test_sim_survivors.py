"""Collectives after a crash are priced among the ranks that take part (the survivors): their
slowest NIC, the nodes that still hold one of them (docs/simulator.md, "Network")."""

import pytest
import torch

from fastsgd.transport.sim import ComputeModel, Faults, Network, simulate
from fastsgd.transport.sim.compute import to_ns
from fastsgd.transport.sim.faults import Crash

FREE = ComputeModel.free()
S = 100_000  # bytes: 25,000 float32
B, L = 100e6 / 8, 2e-3  # 100 Mbit/s, 2 ms
BI, LI = 10e9 / 8, 5e-6  # inside a node
MS = 1_000_000


def _net(**options) -> Network:
    return Network.parse("100Mbit", "2ms", intra_bandwidth="10Gbit", intra_latency="5us",
                         mtu=0, **options)


def _after_crashes(world, lost, net, kind="allreduce", detect_ns=0):
    """Each survivor's time for one collective of `kind` after `lost` crashed (at step 0)."""
    def worker(t):
        t.compute("update", 0)  # the lost crash here
        t.barrier()  # among the survivors, once the loss is known
        began = t.now_ns()
        tensor = torch.ones(S // 4)
        {"allreduce": lambda: t.all_reduce(tensor),
         "allgather": lambda: t.all_gather(tensor),
         "broadcast": lambda: t.broadcast(tensor, src=t.members()[0])}[kind]()
        return t.now_ns() - began

    faults = Faults({r: [Crash(r, step=0)] for r in lost}, detect_ns=detect_ns)
    return [d for d in simulate(world, worker, net, FREE, faults) if d is not None]


def _ring(n, size=S, bandwidth=B, latency=L):
    return 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency


@pytest.mark.parametrize("slow", [0, 3])
def test_the_survivors_do_not_pay_a_lost_workers_slow_nic(slow):
    net = _net(bandwidths={str(slow): "10Mbit"})
    assert _after_crashes(4, [slow], net) == [to_ns(_ring(3))] * 3


def test_a_loss_learnt_while_the_survivors_wait_prices_the_collective_without_it():
    """The survivors reach the all-reduce before the loss is known: it runs among them."""
    net = _net(bandwidths={"0": "10Mbit"})

    def worker(t):
        t.compute("update", 0)  # worker 0 crashes here
        t.all_reduce(torch.ones(S // 4))  # waits for the loss to be known, then runs
        return t.now_ns()

    faults = Faults({0: [Crash(0, step=0)]}, detect_ns=50 * MS)
    assert simulate(4, worker, net, FREE, faults)[1:] == [50 * MS + to_ns(_ring(3))] * 3


def test_survivors_on_two_nodes_still_cross_between_them():
    """Nodes {0, 1} and {2, 3}; 3 lost: 0, 1 and 2 still span both nodes."""
    inside = S / BI + (2 - 1) * LI  # the fullest node holds 2
    expected = to_ns(2 * inside + _ring(2))
    assert _after_crashes(4, [3], _net(workers_per_node=2)) == [expected] * 3


def test_one_survivor_per_node_is_a_plain_ring():
    assert _after_crashes(6, [1, 3, 5], _net(workers_per_node=2)) == [to_ns(_ring(3))] * 3


def test_survivors_on_one_node_stay_inside_it():
    net = _net(workers_per_node=2)
    inside = S / BI + (2 - 1) * LI
    assert _after_crashes(4, [2, 3], net) == [to_ns(2 * inside)] * 2
    assert _after_crashes(4, [2, 3], net, "allgather") == [to_ns(LI + S / BI)] * 2
    assert _after_crashes(4, [2, 3], net, "broadcast") == [to_ns(LI + S / BI)] * 2


def test_a_broadcast_pays_the_network_only_for_rounds_between_nodes():
    """Nodes {0, 1}, {2, 3}: from 0, round 1 is 0 -> 1 (inside), round 2 is 0 -> 2, 1 -> 3."""
    net = _net(workers_per_node=2)
    expected = to_ns((LI + S / BI) + (L + S / B))
    assert _after_crashes(4, [], net, "broadcast") == [expected] * 4
    assert net.broadcast_time(S, [0, 2, 3]) == pytest.approx(2 * (L + S / B))  # 0->2, 0->3
