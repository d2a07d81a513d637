"""Hogwild!: every worker writes into one shared parameter vector, without locks."""

import pytest
import torch

from fastsgd.compress import Identity
from fastsgd.strategies import Context
from fastsgd.strategies.hogwild import Hogwild
from fastsgd.transport.sim import simulate
from tests.strategies.helpers import sim_job


def test_workers_share_one_parameter_vector():
    def worker(t):
        p = torch.nn.Parameter(torch.full((4,), float(t.rank)))
        Hogwild().init([p], Context(t, Identity()))
        with torch.no_grad():
            p[t.rank] += 10.0  # each worker writes its own coordinate
        t.barrier()
        return p.detach().clone()

    for seen in simulate(4, worker):  # everyone sees rank 0's start plus all four writes
        assert seen.tolist() == [10.0, 10.0, 10.0, 10.0]


# the synchronous settings, each optimizer's rate cut to 1/n (adapt_optimizer, the default);
# or a rate tuned by hand for n optimizers writing one vector, without the cut
SETTINGS = [({"name": "hogwild"}, {}),
            ({"name": "hogwild", "adapt_optimizer": False}, {"optimizer.lr": 0.02})]


@pytest.mark.parametrize("strategy, options", SETTINGS)
def test_hogwild_trains(strategy, options, synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, strategy, steps=100, **options).simulate(4)
    assert result.accuracy > 0.6 and result.summary["bytes_sent_total"] == 0
    assert result.summary["consensus_distance"] == 0.0


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy, options", SETTINGS)
def test_hogwild_on_real_processes_shares_memory(strategy, options, synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, strategy, steps=100, **options).run(4)
    assert result.accuracy > 0.6 and result.summary["consensus_distance"] == 0.0
