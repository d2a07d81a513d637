"""localsgd, easgd, bmuf, async_diloco and sparta with a lossy codec: BatchNorm's running
statistics skip the codec, as in diloco (test_diloco_buffers.py). Every worker's statistics
after a sync are their exact mean (easgd: the exact elastic move), and the bytes are the
codec's for the parameters and an exact message for the buffers. Its helpers serve
test_diloco_buffers.py too."""

import pytest
import torch

import fastsgd as fs
from fastsgd.compress import build_compressor
from fastsgd.compress.collectives import all_reduce_mean, init_all_reduce
from fastsgd.compress.wire import pack
from fastsgd.strategies.averaging import BMUF, EASGD, LocalSGD
from fastsgd.strategies.lowcomm.async_diloco import AsyncDiLoCo
from fastsgd.strategies.lowcomm.sparta import Sparta
from fastsgd.transport.frames import frame_bytes
from fastsgd.transport.sim import simulate

WORKERS = 3
CODECS = [{"name": "topk", "ratio": 0.1}, {"name": "qsgd", "levels": 7}]


def bn_model() -> torch.nn.Module:
    """Tensors of 9, 3, 3 and 3 elements, then the buffers running_mean and running_var
    (3 each), in float64."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)).double()


def statistics(model: torch.nn.Module) -> torch.Tensor:
    bn = model[1]
    return torch.cat([bn.running_mean, bn.running_var]).clone()


BUFFERS = torch.tensor([False] * 18 + [True] * 6)  # bn_model: 18 parameter elements, 6 buffer


def train(strategy, codec: dict, steps: int) -> list[list[tuple]]:
    """Each worker's (own statistics, statistics after the sync, bytes the sync sent, the
    strategy's state after it), step by step; worker r normalizes data around 10 r, so the
    statistics differ. `strategy`: a callable making the strategy."""

    def worker(t):
        model = bn_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        replica = fs.Replica(model, t, strategy(), build_compressor(codec), total_steps=steps)
        out = []
        for step in range(steps):
            gen = torch.Generator().manual_seed(100 * step + t.rank)
            x = torch.randn(8, 3, generator=gen, dtype=torch.float64) + 10 * t.rank
            optimizer.zero_grad()
            model(x).square().mean().backward()
            replica.sync_gradients()
            optimizer.step()
            own, before = statistics(model), t.bytes_sent
            replica.sync_parameters()
            state = {k: v.clone() for k, v in replica.state.items()
                     if isinstance(v, torch.Tensor)}
            out.append((own, statistics(model), t.bytes_sent - before, state))
        replica.close()
        return out

    return simulate(WORKERS, worker)


def assert_exact_mean(got: list[list[tuple]], step: int) -> None:
    mean = sum(worker[step][0] for worker in got) / WORKERS
    assert not torch.allclose(got[0][step][0], mean)  # the workers' statistics did differ
    for worker in got:
        assert torch.allclose(worker[step][1], mean, rtol=0, atol=1e-12)
    assert bool((got[0][step][1][3:] > 0).all())  # the running variances


SYNCED = {  # strategy, steps, the steps after which every worker holds the exact mean
    "localsgd": (lambda: LocalSGD(period=1), 3, [0, 1, 2]),
    "bmuf": (lambda: BMUF(period=1, block_momentum=0.9, block_lr=1.0), 3, [0, 1, 2]),
    "bmuf-nesterov": (lambda: BMUF(period=1, block_momentum=0.9, nesterov=True), 3, [0, 1, 2]),
    "async_diloco-lockstep": (lambda: AsyncDiLoCo(period=1, staleness=0, outer_lr=0.7,
                                                  outer_momentum=0.9), 3, [0, 1, 2]),
    # asynchronous: only the final answers wait for every push
    "async_diloco": (lambda: AsyncDiLoCo(period=1, staleness=2, outer_momentum=0.9), 1, [0]),
    # before the last step: all the buffers, whichever entries are drawn
    "sparta": (lambda: Sparta(fraction=0.1), 3, [0, 1]),
}


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c["name"])
@pytest.mark.parametrize("name", SYNCED)
def test_every_worker_holds_the_exact_mean_of_the_statistics(name, codec):
    """Later rounds too: error feedback must not carry statistics from round to round."""
    strategy, steps, synced = SYNCED[name]
    got = train(strategy, codec, steps)
    for step in synced:
        assert_exact_mean(got, step)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c["name"])
def test_easgd_moves_the_statistics_exactly_toward_an_exact_centre(codec):
    """The elastic move, as with the exact codec: each worker's statistics move alpha of the
    way to the centre's, and the centre's by alpha times the sum of the distances."""
    alpha, got = 0.1, train(lambda: EASGD(period=1, alpha=0.1), codec, 2)
    centre = torch.tensor([0.0, 0, 0, 1, 1, 1], dtype=torch.float64)  # a fresh BatchNorm's
    for step in range(2):
        for worker in got:
            own, after = worker[step][0], worker[step][1]
            assert torch.allclose(after, own - alpha * (own - centre), rtol=0, atol=1e-12)
        centre = centre + alpha * sum(worker[step][0] - centre for worker in got)
        for worker in got:
            assert torch.allclose(worker[step][3]["center"][BUFFERS], centre, rtol=0,
                                  atol=1e-12)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c["name"])
@pytest.mark.parametrize("strategy", [LocalSGD, EASGD, BMUF], ids=lambda s: s.name)
def test_averaging_sends_the_codecs_bytes_for_the_parameters_and_an_all_reduce_for_the_buffers(
        strategy, codec):
    sent = [worker[0][2] for worker in train(lambda: strategy(period=1), codec, 1)]
    assert sent == [coded + exact for coded, exact in simulate(WORKERS, alone(codec, 18, 6))]


def alone(codec: dict, coded: int, exact: int):
    """A worker sending the same two collectives on their own: the codec's mean of `coded`
    elements (none: nothing), then the exact all-reduce of `exact` elements."""

    def worker(t):
        compressor = build_compressor(codec)
        x = torch.zeros(coded, dtype=torch.float64)
        if coded:
            all_reduce_mean(x, compressor, init_all_reduce(compressor, x, WORKERS), t)
        after_codec = t.bytes_sent
        t.all_reduce(torch.zeros(exact, dtype=torch.float64))
        return after_codec, t.bytes_sent - after_codec

    return worker


@pytest.mark.parametrize("codec", [{"name": "none"}, *CODECS], ids=lambda c: c["name"])
def test_sparta_sends_the_drawn_parameters_and_every_buffer(codec):
    """The draw is what it was, over all 24 entries; the buffers join it. With the exact codec
    one all-reduce of them all; with a lossy one the drawn parameter entries through the
    codec and the buffers in an exact all-reduce beside it."""
    sent = [worker[0][2] for worker in train(lambda: Sparta(fraction=0.25), codec, 2)]
    drawn = Sparta(fraction=0.25).chosen(24, 0)
    parameters = int((~BUFFERS[drawn]).sum())
    assert 0 < parameters < 6  # of the 6 drawn, some were buffers
    if codec["name"] == "none":
        expected = simulate(WORKERS, alone(codec, 0, parameters + 6))
    else:
        expected = simulate(WORKERS, alone(codec, parameters, 6))
    assert all(exact > 0 for _, exact in expected)
    assert sent == [coded + exact for coded, exact in expected]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c["name"])
def test_an_async_diloco_push_carries_the_buffers_exactly_beside_the_codec(codec):
    """A worker's only message is its push: the codec's payload of the 18 parameter
    elements, then the 6 buffer elements in float64, then the round and the final flag."""
    sent = [worker[0][2] for worker in train(lambda: AsyncDiLoCo(period=1), codec, 1)]
    compressor, x = build_compressor(codec), torch.zeros(18, dtype=torch.float64)
    words = torch.zeros(1, dtype=torch.int64)
    push = pack({**compressor.encode(x, compressor.init(x)),
                 "exact_buffers": torch.zeros(6, dtype=torch.float64),
                 "round": words, "final": words})
    assert sent[1:] == [frame_bytes(push)] * (WORKERS - 1)  # (rank 0 is the server)
