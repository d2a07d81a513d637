"""DiLoCo with a lossy codec: BatchNorm's running statistics skip the codec. Every worker
restarts from their exact mean, fragment by fragment, and their bytes are those of an exact
all-reduce beside the codec's."""

import pytest
import torch

import fastsgd as fs
from fastsgd.compress import build_compressor
from fastsgd.compress.collectives import all_reduce_mean, init_all_reduce
from fastsgd.strategies.diloco import DiLoCo, split
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


def train(codec: dict, steps: int, **settings) -> list[list[tuple]]:
    """Each worker's (own statistics, statistics after the sync, bytes the sync sent), step by
    step; worker r normalizes data around 10 r, so the statistics differ."""

    def worker(t):
        model = bn_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        replica = fs.Replica(model, t, DiLoCo(**settings), build_compressor(codec),
                             total_steps=steps)
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
            out.append((own, statistics(model), t.bytes_sent - before))
        return out

    return simulate(WORKERS, worker)


def assert_exact_mean(got: list[list[tuple]], step: int) -> None:
    mean = sum(worker[step][0] for worker in got) / WORKERS
    assert not torch.allclose(got[0][step][0], mean)  # the workers' statistics did differ
    for worker in got:
        assert torch.allclose(worker[step][1], mean, rtol=0, atol=1e-12)
    assert bool((got[0][step][1][3:] > 0).all())  # the running variances


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c["name"])
@pytest.mark.parametrize("fragments", [1, 3, 6])  # 6: two fragments of buffers only
def test_every_worker_restarts_from_the_exact_mean_of_the_statistics(codec, fragments):
    """One step, the last: every fragment syncs at once through the lossy codec."""
    assert_exact_mean(train(codec, 1, period=1, fragments=fragments), 0)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c["name"])
def test_a_staggered_fragment_of_parameters_and_buffers_syncs_them_exactly(codec):
    """Period 3, 3 fragments: the last ([bias, running_mean, running_var]) syncs after step
    1, alone, not at the end of the run."""
    assert split([9, 3, 3, 3, 3, 3], 3)[-1] == (3, 6)
    got = train(codec, 4, period=3, fragments=3)
    assert_exact_mean(got, 1)
    assert got[0][0][2] > 0 and got[0][2][2] > 0  # the other fragments, on their own steps


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c["name"])
def test_the_bytes_are_the_codecs_for_the_parameters_and_an_all_reduce_for_the_buffers(codec):
    sent = [worker[0][2] for worker in train(codec, 1, period=1)]

    def alone(t):
        """The same two collectives on their own: the codec's mean of the 18 parameter
        elements, then the exact all-reduce of the 6 buffer elements."""
        compressor = build_compressor(codec)
        coded = torch.zeros(18, dtype=torch.float64)
        all_reduce_mean(coded, compressor, init_all_reduce(compressor, coded, WORKERS), t)
        after_codec = t.bytes_sent
        t.all_reduce(torch.zeros(6, dtype=torch.float64))
        return after_codec, t.bytes_sent - after_codec

    expected = simulate(WORKERS, alone)
    assert all(exact > 0 for _, exact in expected)
    assert sent == [coded + exact for coded, exact in expected]
