"""DiLoCo with a lossy codec: BatchNorm's running statistics skip the codec. Every worker
restarts from their exact mean, fragment by fragment, and their bytes are those of an exact
all-reduce beside the codec's."""

import pytest
import torch

from fastsgd.compress import build_compressor
from fastsgd.compress.collectives import all_reduce_mean, init_all_reduce
from fastsgd.strategies.diloco import DiLoCo, split
from fastsgd.transport.sim import simulate
from tests.strategies import test_lossy_buffers as lossy
from tests.strategies.test_lossy_buffers import CODECS, WORKERS, assert_exact_mean


def train(codec: dict, steps: int, **settings) -> list[list[tuple]]:
    """Each worker's (own statistics, statistics after the sync, bytes the sync sent, ...),
    step by step, under DiLoCo(**settings)."""
    return lossy.train(lambda: DiLoCo(**settings), codec, steps)


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
