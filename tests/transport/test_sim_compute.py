"""The compute model: fixed phase times, heterogeneity from seeded streams, trace files."""

import statistics

import pytest
import torch

from fastsgd.transport.sim import ComputeModel, Heterogeneity, Network, load_trace, simulate
from fastsgd.transport.sim.compute import to_ns

NET = Network.parse("100Mbit", "1ms", mtu=0)
MS = 1_000_000  # ns


def _fixed(spread=None, trace=None, reduce_bandwidth=0.0):
    return ComputeModel("fixed", {"forward": 10 * MS, "backward": 20 * MS, "update": 0,
                                  "codec": 0}, reduce_bandwidth, spread or Heterogeneity(), trace)


def _clock_after_phases(t, steps=1):
    for k in range(steps):
        t.compute("forward", k)
        t.compute("backward", k)
    return round(t.now() * 1e9)


def test_fixed_times_and_per_worker_slowdown():
    out = simulate(3, _clock_after_phases, NET, _fixed(Heterogeneity((1.0, 2.0))))
    assert out == [30 * MS, 60 * MS, 30 * MS]  # rank 2 has no factor: 1


def test_stragglers_and_noise_come_from_a_stream_per_worker_and_step():
    always = Heterogeneity(straggler_prob=0.999999, straggler_factor=3.0)
    assert simulate(2, _clock_after_phases, NET, _fixed(always)) == [90 * MS] * 2
    noisy = Heterogeneity(sigma=0.5, seed=7)
    factors = [noisy.factor(0, k) for k in range(4000)]
    assert statistics.mean(factors) == pytest.approx(1.0, abs=0.05)  # mean-one noise
    assert noisy.factor(1, 5) == Heterogeneity(sigma=0.5, seed=7).factor(1, 5)  # no state
    assert noisy.factor(1, 5) != Heterogeneity(sigma=0.5, seed=8).factor(1, 5)


def test_a_trace_sets_availability_speed_and_bandwidth(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("rank,start,end,speed,bandwidth\n"
                    "0,0s,,1,\n"
                    "1,0s,5ms,1,\n"  # available briefly, then from 1 s on at half speed
                    "1,1s,,0.5,10Mbit\n")
    trace = load_trace(str(path))

    def worker(t):
        clock = _clock_after_phases(t)  # rank 1: forward in the first window, backward waits
        if t.rank == 0:
            t.scheduler.charge(0, 1100 * MS - clock)
            t.send(torch.zeros(2500), 1)  # at 1.1 s: 10 kB into rank 1's 10 Mbit/s downlink
            return clock
        t.recv(torch.empty(2500), 0)
        return clock, round(t.now() * 1e9)

    fast, (slow, received) = simulate(2, worker, NET, _fixed(trace=trace))
    assert fast == 30 * MS
    assert slow == 10 * MS + (1000 * MS - 10 * MS) + 40 * MS  # waits for 1 s, half speed
    assert received == 1100 * MS + 8 * MS + 1 * MS  # 10 kB at 10 Mbit/s, then the latency


def test_a_received_message_costs_its_reduction():
    model = _fixed(reduce_bandwidth=1e9)  # 1 GB/s: 10 kB take 10 us

    def worker(t):
        if t.rank == 0:
            t.send(torch.zeros(2500), 1)
            return None
        t.recv(torch.empty(2500), 0)
        return round(t.now() * 1e9)

    expected = to_ns(NET.latency + 10_000 / NET.bandwidth) + to_ns(10_000 / 1e9)
    assert simulate(2, worker, NET, model)[1] == expected


def test_a_server_handles_messages_one_after_another_on_its_own_timeline():
    """Each push costs the server bytes / reduce_bandwidth; the next waits for it, and the
    reply leaves when its handling ends."""
    model = _fixed(reduce_bandwidth=1e6)  # 1 MB/s: a 10 kB push takes 10 ms to apply
    push = torch.zeros(2500 - 16)  # 10 kB with its 64-byte frame header

    def worker(t):
        t.start_messages()
        if t.rank == 0:
            t.serve(7, lambda src, m: t.post(torch.ones(1), src, 8))
            t.barrier()
            return None
        t.post(push, 0, 7)
        t.wait_message(8)
        arrived = round(t.now() * 1e9)
        t.barrier()
        return arrived

    wire = to_ns(10_000 / NET.bandwidth)  # 0.8 ms per push on rank 0's downlink
    latency = to_ns(NET.latency)
    # a 68-byte reply: on the wire, then the worker adds it in (68 us at 1 MB/s)
    reply = to_ns(68 / NET.bandwidth) + latency + to_ns(68 / 1e6)
    first_done = latency + wire + 10 * MS
    second_done = first_done + 10 * MS  # it came at latency + 2 wire, then waited
    _, one, two = simulate(3, worker, NET, model)
    assert (one, two) == (first_done + reply, second_done + reply)


def test_an_empty_end_has_no_end(tmp_path):
    """A window with an empty end lasts however long the run does: phases of 1e9 s (the
    longest time a config takes) run on past 2**62 ns (4.6e9 s), which it once ended at."""
    path = tmp_path / "trace.csv"
    path.write_text("rank,start,end,speed,bandwidth\n0,0s,,1,\n")
    model = ComputeModel("fixed", {"forward": 10 ** 18, "backward": 10 ** 18},
                         trace=load_trace(str(path)))
    assert simulate(1, lambda t: _clock_after_phases(t, steps=3), NET, model) == [6 * 10 ** 18]


def test_the_draws_seed_is_compute_seed_or_the_runs():
    from fastsgd.config import schema as cfg
    from fastsgd.strategies import CHOICES
    from fastsgd.transport.sim.compute import heterogeneity

    section = cfg.load(CHOICES, None, ["compute.sigma=0.5"])["compute"]
    assert heterogeneity(section, 3).seed == 3  # compute.seed = -1: the run's
    assert heterogeneity({**section, "seed": 5}, 3).seed == 5


# a lossy all-reduce of 2 workers encodes the whole vector (to scatter it) and then its own
# reduced half (to gather it): 1.5 vectors (compress/collectives.py)
@pytest.mark.parametrize("strategy,options,encodes", [
    ("allreduce", {}, 8 * 1.5),  # the gradient, every step
    ("localsgd", {"strategy.period": 4}, 2 * 1.5)])  # the parameters, once a round
def test_a_codec_is_charged_as_much_as_the_strategy_encodes(strategy, options, encodes,
                                                             tmp_path):
    """compute.codec (one whole gradient's encode and decode) charged for what the strategy
    encodes, where it encodes it (issue 51, item 2): localsgd was charged it every step,
    whether it encoded or not."""
    import fastsgd as fs

    def run(codec: str) -> float:
        settings = {"data.name": "digits", "model.name": "mlp", "run.workers": 2,
                    "run.steps": 8, "run.eval_every": 0, "compute.model": "fixed",
                    "compute.step_time": "3ms", "compute.codec": "10ms",
                    "network.bandwidth": "1000Gbit", "network.latency": "0s",
                    "strategy.name": strategy, **options, "compression.name": codec,
                    "run.out": str(tmp_path / codec)}
        return fs.Job(options=settings, quiet=True, report=False).simulate().summary[
            "simulated_time"]

    assert run("fp16") - run("none") == pytest.approx(encodes * 0.010, abs=2e-4)


@pytest.mark.parametrize("strategy,options,rounds", [
    ("allreduce", {}, 0),  # no work of its own: the optimizer steps on the averaged gradient
    ("localsgd", {"strategy.period": 4}, 2),  # an average after steps 4 and 8
    ("diloco", {"strategy.period": 4}, 2),  # the outer step
    ("diloco", {"strategy.period": 4, "strategy.fragments": 2}, None),  # each fragment's
    # syncs, at its share of the model (_fragment_rounds)
    ("bmuf", {"strategy.period": 2}, 4)])
def test_the_strategys_own_work_is_charged_once_a_round(strategy, options, rounds, tmp_path):
    """compute.strategy (the strategy's round over the whole model: an average, an outer
    step) charged for the share of the model each round covers, where it does it (issue
    51, item 2)."""
    import fastsgd as fs

    def run(seconds: str) -> float:
        settings = {"data.name": "digits", "model.name": "mlp", "run.workers": 2,
                    "run.steps": 8, "run.eval_every": 0, "compute.model": "fixed",
                    "compute.step_time": "3ms", "compute.strategy": seconds,
                    "network.bandwidth": "1000Gbit", "network.latency": "0s",
                    "strategy.name": strategy, **options, "run.out": str(tmp_path / seconds)}
        return fs.Job(options=settings, quiet=True, report=False).simulate().summary[
            "simulated_time"]

    if options.get("strategy.fragments"):  # the charged shares are the fragments' sizes
        rounds = _fragment_rounds(options["strategy.period"], 8)
    assert run("10ms") - run("0s") == pytest.approx(rounds * 0.010, abs=2e-5)


def _fragment_rounds(period: int, steps: int) -> float:
    """The whole-model rounds 2 fragments of the digits MLP sync in `steps` steps: each
    its share of the parameters, per sync (strategies/diloco.py `due`, and all at the end)."""
    from fastsgd.strategies.diloco import DiLoCo, split
    from fastsgd.workloads.data import load_dataset
    from fastsgd.workloads.models import build_model

    digits = load_dataset("digits", seed=0)
    model = build_model("mlp", tuple(digits.train_x.shape[1:]), digits.num_classes)
    sizes = [p.numel() for p in model.parameters()]
    groups = split(sizes, 2)
    shares = [sum(sizes[a:b]) / sum(sizes) for a, b in groups]
    strategy = DiLoCo(period=period, fragments=2)
    syncs = [sum(1 for s in range(steps) if strategy.due(f, s) or s == steps - 1)
             for f in range(2)]
    return sum(n * share for n, share in zip(syncs, shares))
