"""Asynchronous strategies: push-sum conserves mass; Statement 1 of the FAST paper."""

import pytest
import torch

from fastsgd.compress import build_compressor
from fastsgd.strategies import Context
from fastsgd.strategies.async_gossip import SGP
from fastsgd.transport.sim import ComputeModel, Heterogeneity, Network, simulate
from tests.strategies.helpers import sim_job

JITTERY = Network.parse("1Gbit", "1ms", jitter="20ms", seed=3)
STRAGGLERS = ComputeModel(spread=Heterogeneity((1.0, 3.0, 1.0, 7.0, 2.0)))


@pytest.mark.parametrize("codec", ["none", "topk", "onebit"])
def test_push_sum_keeps_the_mass_whatever_the_delays(codec):
    """No gradients: after the drain, sum of weights = n and sum of w*z = sum of the starts,
    whatever a codec holds back (a sender loses exactly the mass its peer adds), even when
    the jitter reorders an edge's pushes."""
    def worker(t):
        start, z, state = gossip_apart(t, SGP(average_at_end=False), codec, steps=30, dim=500)
        return start, z, float(state["weight"])

    out = simulate(5, worker, JITTERY, STRAGGLERS)
    assert sum(w for _, _, w in out) == pytest.approx(5.0, rel=1e-12)
    mass = sum(w * z for _, z, w in out)
    assert torch.allclose(mass, sum(s for s, _, _ in out), atol=1e-10)


def test_statement_1_complete_communication_ends_consistent():
    """Viviani et al. 2019, Statement 1: SGD without momentum; every worker sends every update
    to every other; updates arrive late and in any order; once every queued update is applied,
    all replicas are identical."""
    steps, lr = 20, 0.1

    def worker(t):
        t.start_messages()
        w = torch.zeros(64, dtype=torch.float64)  # w0, the common start
        rng = torch.Generator().manual_seed(100 + t.rank)
        applied = 0
        for _ in range(steps):
            update = -lr * torch.randn(64, generator=rng, dtype=torch.float64)  # a gradient step
            w += update
            for peer in range(t.world_size):
                if peer != t.rank:
                    t.post(update, peer, tag=9)
            for _, remote in t.poll(9):  # apply whatever has arrived: different orders
                w += remote
                applied += 1
        while applied < steps * (t.world_size - 1):  # empty the queues
            w += t.wait_message(9)[1]
            applied += 1
        return w

    replicas = simulate(5, worker, JITTERY, STRAGGLERS)
    for w in replicas[1:]:
        assert torch.allclose(w, replicas[0], rtol=0, atol=1e-12)
    assert not torch.equal(replicas[0], torch.zeros(64, dtype=torch.float64))


@pytest.mark.parametrize("strategy", [
    {"name": "sgp"}, {"name": "sgp", "topology": "ring"},
    {"name": "adpsgd", "topology": "torus"}, {"name": "adpsgd", "rotate": True},
])
def test_asynchronous_strategies_train(strategy, synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, strategy, steps=150, **{
        "network.jitter": "2ms", "compute.slowdown": [1, 1, 1, 3]})
    assert job.simulate(4).accuracy > 0.6


@pytest.mark.multiproc
@pytest.mark.parametrize("name", ["sgp", "adpsgd"])
def test_asynchronous_strategies_on_real_processes(name, synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": name}, steps=100).run(workers=4)
    assert result.accuracy > 0.5 and result.summary["bytes_sent_total"] > 0


@pytest.mark.parametrize("codec", ["none", "topk", "onebit"])
def test_pairwise_gossip_keeps_the_sum_whatever_the_codec_loses(codec):
    """adpsgd with no gradients: each exchange adds d to one end and takes it from the other,
    so the replicas' average never moves; the spread shrinks even through a lossy codec."""
    from fastsgd.strategies.pairwise import ADPSGD

    def worker(t):
        return gossip_apart(t, ADPSGD(topology="ring"), codec, steps=1000, dim=100)[:2]

    starts, ends = map(torch.stack, zip(*simulate(6, worker)))
    assert torch.allclose(ends.mean(0), starts.mean(0), atol=1e-9)
    spread = lambda x: ((x - x.mean(0)) ** 2).sum(-1).mean()  # noqa: E731
    # how many exchanges complete depends on measured compute times: a loose bound
    assert spread(ends) < 0.3 * spread(starts)


def gossip_apart(t, strategy, codec: str, steps: int, dim: int):
    """Every replica starts at zero (the strategy's common start), is pushed apart to a
    random point of its own, then gossips with no gradients: (start, end, state)."""
    x = torch.nn.Parameter(torch.zeros(dim, dtype=torch.float64))
    options = {"name": codec, "ratio": 0.1} if codec == "topk" else {"name": codec}
    ctx = Context(t, build_compressor(options), total_steps=steps)
    state = strategy.init([x], ctx)
    start = torch.randn(dim, generator=torch.Generator().manual_seed(t.rank),
                        dtype=torch.float64)
    with torch.no_grad():
        x.copy_(start)
    for step in range(steps):
        ctx.step = step
        strategy.on_parameters([x], state, ctx)
    return start, x.detach().clone(), state


@pytest.mark.parametrize("name", ["sgp", "adpsgd"])
def test_replicas_end_averaged_unless_asked_not_to(name, synthetic, tmp_path):
    """After the drain one all-reduce leaves every replica at the average gossip preserved;
    with average_at_end = false each keeps its own (stragglers keep them apart)."""
    spread = {}
    for average in (True, False):
        job = sim_job(synthetic, tmp_path / str(average), {"name": name,
                      "average_at_end": average}, steps=30,
                      **{"compute.slowdown": [1, 3, 1, 7]})
        result = job.simulate(workers=4, network=JITTERY)
        spread[average] = result.summary["consensus_distance"]
    assert spread[True] < 1e-12 < 1e-6 < spread[False]


def test_push_numbers_start_again_for_a_new_process_at_either_end():
    """run.rejoin: a sender numbers its pushes to a rank from 0 again once a new process
    stands for that rank (the new one waits for number 0), and a joiner's pushes carry the
    step it joined at, so a receiver keeps them apart from the lost one's; each carries the
    step it was pushed at (max_lag)."""
    from fastsgd.compress.wire import unpack

    class Sent:
        rank, posted = 0, []

        def returned_at(self, rank, step):
            return 10 if rank == 2 and step >= 10 else 0

        def post(self, buffer, dst, tag):
            self.posted.append(buffer)

    sgp, t = SGP(), Sent()
    sgp._codec, sgp._since = build_compressor({"name": "none"}), 0
    sgp._fields = ["values", "weight", "number"]
    state = {"pushed": {}}
    z, share = torch.zeros(3), torch.ones(1, dtype=torch.float64)
    for step in (8, 9, 10, 11):
        sgp._push(t, 2, [z], None, share, state, step)
    numbers = [unpack(b, sgp._fields)["number"].tolist() for b in t.posted]
    assert numbers == [[0, 0, 8], [0, 1, 9], [0, 0, 10], [0, 1, 11]]
    sgp.joined(10, [])  # this process took a lost one's place at step 10
    sgp._push(t, 1, [z], None, share, state, 12)
    assert unpack(t.posted[-1], sgp._fields)["number"].tolist() == [10, 0, 12]
    held = {}
    state = {"held": held, "taken": {(1, 0): 5}}
    sgp._hold([(1, t.posted[-1])], state)
    # applied: a new sequence, on the edge to worker 1's process that joined at step 10
    assert [edge for edge, _ in sgp._in_order(state)] == [(1, 10)]
    assert sgp._seen == {1: 12}


def test_parameters_of_two_dtypes_push_as_one_flat_copy_and_end_averaged():
    """The exact codec packs the parameters straight into a push, which needs one dtype; a
    model with a float64 buffer beside float32 weights pushes a flat copy instead. Both are
    mixed alike (the buffer stays 10x the weights) and the run ends in consensus. On the
    plain mean of the de-biased models (average_at_end), which is the workers' first mean
    (1) only where their push-sum weights end alike: with measured compute that depended on
    the machine's load (1.054 once in a full suite; with fixed compute, jitter seed 9 and 5 ms
    steps, always)."""
    def worker(t):
        params = [torch.nn.Parameter(torch.full((3,), float(t.rank))),
                  torch.nn.Parameter(torch.full((2,), 10.0 * t.rank, dtype=torch.float64))]
        sgp, ctx = SGP(topology="ring"), Context(t, build_compressor({"name": "none"}),
                                                  total_steps=5)
        state = sgp.init(params, ctx)
        for step in range(5):
            ctx.step = step
            sgp.on_parameters(params, state, ctx)
        return [p.detach().clone() for p in params]

    out = simulate(3, worker, JITTERY, STRAGGLERS)
    for weights, buffer in out:
        assert torch.equal(weights, out[0][0]) and torch.equal(buffer, out[0][1])
        assert weights.dtype == torch.float32 and buffer.dtype == torch.float64
        assert 0 < float(weights[0]) < 2 and torch.equal(weights, weights[:1].expand(3))
        assert torch.allclose(buffer, 10 * weights[:2].double())


@pytest.mark.parametrize("max_lag", [0, 3])
def test_max_lag_bounds_how_far_behind_a_mixed_push_is(max_lag, synthetic, tmp_path):
    """A worker three times slower than the others: unbounded (0), the others run ever
    further ahead and mix in ever older pushes of it; with max_lag = 3 none is mixed more
    than 3 steps after it was pushed (they wait for it)."""
    result = sim_job(synthetic, tmp_path, {"name": "sgp", "topology": "ring",
                                           "max_lag": max_lag}, steps=60,
                     **{"compute.slowdown": [1, 1, 1, 3]}).simulate(4)
    lag = max(m["staleness"] for m in result.metrics())
    assert lag <= 3 if max_lag else lag > 20


def test_max_in_flight_keeps_pushes_fresh_on_a_slow_uplink(synthetic, tmp_path):
    """At 200 Mbit/s a push takes longer than a step. Unbounded (0), each worker queues its
    pushes until max_lag (16) makes the receivers wait: what is mixed is 16 steps old. With
    max_in_flight = 1 a worker pushes once its last push has left, so what is mixed is at
    most 2 steps old, in the same time (the uplink's pace either way), and it trains."""
    runs = {}
    for bound in (0, 1):
        result = sim_job(synthetic, tmp_path / str(bound), {"name": "sgp", "max_in_flight":
                                                            bound}, steps=60,
                         **{"network.bandwidth": "200Mbit"}).simulate(4)
        rows = result.metrics()
        runs[bound] = (max(m["staleness"] for m in rows), max(m["time"] for m in rows),
                       result.summary["final_accuracy"])
    assert runs[0][0] == 16 and runs[1][0] <= 2
    assert runs[1][1] == pytest.approx(runs[0][1], rel=0.02)
    assert runs[1][2] > runs[0][2] + 0.1


@pytest.mark.parametrize("max_lag", [0, 3])
def test_adpsgd_max_lag_bounds_how_far_ahead_of_a_slow_worker_the_others_run(
        max_lag, synthetic, tmp_path):
    """Worker 3 three times slower: unbounded (0), the others end 40 steps ahead of it;
    with max_lag = 3 its ring neighbours stay within 3 steps of what it last said (a word
    every max_lag / 2 steps), and worker 1, two hops away, within twice that."""
    import bisect

    result = sim_job(synthetic, tmp_path, {"name": "adpsgd", "max_lag": max_lag}, steps=60,
                     **{"compute.slowdown": [1, 1, 1, 3]}).simulate(4)
    rows = result.metrics()
    slow = sorted(m["time"] for m in rows if m["rank"] == 3)  # when it finished each step
    ahead = max(m["step"] - bisect.bisect_right(slow, m["time"]) for m in rows
                if m["rank"] != 3)
    assert ahead <= 2 * (max_lag + 1) if max_lag else ahead > 20
