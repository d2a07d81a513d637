"""The simulator's clock follows the network model exactly when compute is free."""

import pytest
import torch

from fastsgd.transport.base import ring_allreduce_bytes
from fastsgd.transport.sim import ComputeModel, Heterogeneity, Network, simulate

NET = Network.parse("100Mbit", "2ms", mtu=0)  # payload bytes only: S/B
FREE = ComputeModel.free()  # compute takes no virtual time


def test_allreduce_sums_and_takes_the_ring_time():
    def worker(t):
        x = torch.full((1000,), float(t.rank + 1))
        t.all_reduce(x)
        return float(x[0]), t.now(), t.bytes_sent

    out = simulate(4, worker, NET, FREE)
    assert [o[0] for o in out] == [10.0] * 4
    expected = 2 * 3 / 4 * 4000 / NET.bandwidth + 2 * 3 * NET.latency
    assert all(o[1] == pytest.approx(expected, rel=1e-12) for o in out)
    assert all(o[2] == ring_allreduce_bytes(4000, 4) == 6000 for o in out)


def test_collectives_wait_for_the_last_worker_and_share_the_links():
    def worker(t):
        a, b = torch.ones(250), torch.ones(250)
        if t.rank == 1:
            t.scheduler.charge(1, 500_000_000)  # rank 1 arrives at t = 0.5
        h1 = t.all_reduce(a, async_op=True)
        h2 = t.all_reduce(b, async_op=True)
        h1.wait()
        first = t.now()
        h2.wait()
        return first, t.now()

    out = simulate(2, worker, NET, FREE)
    one = NET.allreduce_time(1000, 2)
    assert out[0] == pytest.approx((0.5 + one, 0.5 + 2 * one))
    assert out[1] == out[0]


def test_an_all_reduce_in_flight_holds_no_buffer_of_the_worker_and_each_gets_the_sum():
    """A tensor nothing else uses gives its memory up while its all-reduce is in flight
    (folded in on arrival; taken as it is where it arrives before its turn) and holds the
    sum after wait(), bitwise the sum in rank order; a tensor with a view is summed in place,
    so that the view sees the result."""
    parts = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    expected = parts[0].clone()
    for part in parts[1:]:
        expected += part

    def worker(t):
        t.scheduler.charge(t.rank, (4 - t.rank) * 1_000_000)  # arrive in reverse rank order
        alone, shared = parts[t.rank].clone(), parts[t.rank].clone()
        view = shared[10:20]
        h1, h2 = t.all_reduce(alone, async_op=True), t.all_reduce(shared, async_op=True)
        in_flight = alone.numel(), shared.numel()
        h1.wait()
        h2.wait()
        return alone, shared, view, in_flight

    for alone, shared, view, in_flight in simulate(4, worker, NET, FREE):
        assert in_flight == (0, 1000)  # given up; kept (a view uses it)
        assert torch.equal(alone, expected) and alone.shape == (1000,)
        assert torch.equal(shared, expected) and torch.equal(view, expected[10:20])


def test_messages_take_latency_plus_size_over_bandwidth_and_queue_on_the_link():
    def worker(t):
        if t.rank == 0:
            t.send(torch.zeros(2500), 1)  # 10 kB
            t.send(torch.ones(2500), 1)
            return t.bytes_sent
        first, second = torch.empty(2500), torch.empty(2500)
        t.recv(first, 0)
        arrived = t.now()
        t.recv(second, 0)
        return arrived, t.now(), float(first.sum()), float(second.sum()), t.bytes_received

    sent, (t1, t2, s1, s2, received) = simulate(2, worker, NET, FREE)
    serialize = 10_000 / NET.bandwidth
    assert t1 == pytest.approx(NET.latency + serialize)
    assert t2 == pytest.approx(NET.latency + 2 * serialize)
    assert (s1, s2) == (0.0, 2500.0)
    assert sent == received == 20_000


def test_all_gather_and_broadcast():
    def worker(t):
        gathered = t.all_gather(torch.tensor([t.rank * 10]))
        x = torch.tensor([float(t.rank)])
        t.broadcast(x, src=2)
        return [int(g) for g in gathered], float(x)

    for gathered, x in simulate(3, worker, NET, FREE):
        assert gathered == [0, 10, 20] and x == 2.0


def test_a_receive_that_never_completes_is_reported_as_deadlock():
    def worker(t):
        if t.rank == 1:
            t.recv(torch.empty(1), 0)

    with pytest.raises(RuntimeError, match=r"deadlock: workers \[1\]"):
        simulate(2, worker, NET, FREE)


def test_a_worker_error_stops_the_simulation_and_reaches_the_caller():
    def worker(t):
        if t.rank == 2:
            raise ValueError("boom on 2")
        t.all_reduce(torch.ones(3))

    with pytest.raises(ValueError, match="boom on 2"):
        simulate(4, worker, NET, FREE)


def test_slowdown_scales_measured_compute():
    def worker(t):
        torch.randn(300, 300) @ torch.randn(300, 300)
        t.barrier()
        return t.now()

    # the straggler's compute is 1e4 times longer: everyone waits for it at the barrier
    fast = simulate(2, worker, NET, ComputeModel())
    slow = simulate(2, worker, NET, ComputeModel(spread=Heterogeneity((1.0, 1e4))))
    assert slow[0] > 100 * fast[0]  # the fast worker's clock waited for the straggler
    assert slow[1] >= slow[0]


def test_network_units():
    assert Network.parse("1Gbit", "20ms") == Network(1e9 / 8, 0.02)
    assert Network.parse("1GB", "50us").bandwidth == 1e9
