"""LTFB tournaments: pairs swap models and keep the better one on their own sample."""

import pytest
import torch

from fastsgd.compress import Identity
from fastsgd.strategies import Context
from fastsgd.strategies.tournament import Tournament, pairing
from fastsgd.transport.sim import simulate
from tests.strategies.helpers import sim_job


def test_pairing_is_a_matching_shared_by_all():
    for n in (2, 5, 8):
        for r in range(5):
            pairs = pairing(n, r)
            assert all(pairs[pairs[a]] == a and pairs[a] != a for a in pairs)
            assert len(pairs) == n - n % 2


def test_each_keeps_the_model_with_the_lower_loss():
    def worker(t):
        p = torch.nn.Parameter(torch.full((3,), float(t.rank)))
        target = 0.0 if t.rank % 2 == 0 else 3.0  # even ranks like 0, odd ranks like 3
        ctx = Context(t, Identity(), step=9,
                      score=lambda: float((p.detach() - target).abs().sum()))
        strategy = Tournament(period=10)
        state = strategy.init([p], ctx)
        strategy.on_parameters([p], state, ctx)
        return pairing(4, 1)[t.rank], float(p[0].detach())

    for rank, (partner, kept) in enumerate(simulate(4, worker)):
        candidates = {rank, partner}
        best = min(candidates) if rank % 2 == 0 else max(candidates)
        assert kept == float(best)


def test_ltfb_trains(synthetic, tmp_path):
    # the synchronous settings: each model's rate is cut to 1/4 (adapt_optimizer), so it
    # takes more steps than the 150 it needed at the full rate
    result = sim_job(synthetic, tmp_path, {"name": "ltfb", "period": 20}, steps=250).simulate(4)
    assert result.accuracy > 0.6
    sends = {m["step"] for m in result.metrics() if m["bytes_sent"] > 0}
    assert sends == set(range(20, 251, 20))


@pytest.mark.multiproc
def test_ltfb_on_real_processes(synthetic, tmp_path):
    # 200 steps: each model at a quarter of the rate (adapt_optimizer)
    result = sim_job(synthetic, tmp_path, {"name": "ltfb", "period": 20}, steps=200).run(4)
    assert result.accuracy > 0.5
