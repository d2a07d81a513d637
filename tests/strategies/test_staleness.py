"""Staleness-aware defaults: what the asynchronous strategies do to the user's optimizer."""

import pytest
import torch

from fastsgd.compress import Identity
from fastsgd.errors import ConfigError
from fastsgd.strategies import STRATEGIES, Context
from fastsgd.strategies.staleness import Adjustment, explicit_momentum, implicit_momentum, restore
from fastsgd.transport.sim import simulate
from tests.strategies.helpers import sim_job


def test_implicit_momentum_of_m_queued_workers_is_one_minus_one_over_m():
    for m in (1, 2, 4, 16):  # Mitliagkas et al. 2016: mean staleness M - 1
        assert implicit_momentum(m - 1) == pytest.approx(1 - 1 / m)


def test_explicit_momentum_keeps_the_total_time_constant():
    assert explicit_momentum(0.9, 0) == 0.9
    assert explicit_momentum(0.0, 3) == 0.0
    for tau in (0.5, 1.5, 3.0):  # (1 - mu_e)(1 - mu_i) = 1 - mu
        mu_e = explicit_momentum(0.9, tau)
        assert (1 - mu_e) * (1 - implicit_momentum(tau)) == pytest.approx(0.1)
    assert explicit_momentum(0.9, 1.5) == pytest.approx(0.75)
    assert explicit_momentum(0.9, 20) == 0.0  # never below plain SGD


def test_an_adjustment_applied_twice_does_not_compound_and_can_be_undone():
    p = torch.nn.Parameter(torch.zeros(3))
    sgd = torch.optim.SGD([p], lr=0.05, momentum=0.9)
    for _ in range(2):
        assert Adjustment(lr_scale=0.25, staleness=3).apply(sgd) == [
            {"lr": pytest.approx(0.0125), "momentum": pytest.approx(0.6)}]
    restore(sgd)
    assert (sgd.param_groups[0]["lr"], sgd.param_groups[0]["momentum"]) == (0.05, 0.9)
    adam = torch.optim.Adam([p], lr=1e-3, betas=(0.9, 0.999))
    Adjustment(staleness=1.5).apply(adam)
    assert adam.param_groups[0]["betas"] == (pytest.approx(0.75), 0.999)
    assert Adjustment().apply(None) == []


def settings_after_init(strategy: dict, workers: int = 4):
    """Each worker's (lr, momentum) after the strategy's init, SGD lr 0.05 momentum 0.9."""
    def worker(t):
        p = torch.nn.Parameter(torch.zeros(8))
        sgd = torch.optim.SGD([p], lr=0.05, momentum=0.9)
        built = STRATEGIES.build(dict(strategy))
        built.init([p], Context(t, Identity(), total_steps=1, optimizer=sgd))
        t.barrier()
        return round(sgd.param_groups[0]["lr"], 9), round(sgd.param_groups[0]["momentum"], 9)

    return set(simulate(workers, worker))


@pytest.mark.parametrize("strategy, adapted", [
    ({"name": "ssp"}, (0.05, 0.75)),  # staleness 2: mean age 1.5 steps
    ({"name": "ssp", "staleness": 0}, (0.05, 0.9)),  # synchronous: nothing to adapt
    ({"name": "hogwild"}, (0.0125, 0.9)),  # four optimizers step one vector
    ({"name": "ltfb"}, (0.0125, 0.9)),  # four models, each on a quarter of the batch
    ({"name": "ps"}, (0.05, 0.6)),  # and the server averages the pushes
    ({"name": "adpsgd"}, (0.05, 0.9)),  # gossip averages: the synchronous settings hold
    ({"name": "sgp"}, (0.05, 0.9)),
])
def test_what_each_strategy_does_to_the_optimizer(strategy, adapted):
    assert settings_after_init(strategy) == {adapted}
    if "adapt_optimizer" in STRATEGIES.get(strategy["name"]).OPTIONS:
        off = {**strategy, "adapt_optimizer": False}
        assert settings_after_init(off) == {(0.05, 0.9)}


def test_adapt_optimizer_is_checked_like_other_options():
    with pytest.raises(ConfigError, match="strategy.adapt_optimizer must be of type bool"):
        STRATEGIES.build({"name": "ssp", "adapt_optimizer": "yes"})


def _pushes(adapt: bool):
    def worker(t):
        from fastsgd.strategies.ps import ParameterServer

        p = torch.nn.Parameter(torch.zeros(100, dtype=torch.float64))
        strategy = ParameterServer(adapt_optimizer=adapt)
        ctx = Context(t, Identity(), total_steps=10)
        state = strategy.init([p], ctx)
        for step in range(10):
            ctx.step = step
            with torch.no_grad():
                p += 1.0  # every worker moves every coordinate by 1 a step
            strategy.on_parameters([p], state, ctx)
        t.barrier()
        return state.get("shard")

    return simulate(4, worker)[0]


def test_the_server_averages_the_pushes_unless_told_not_to():
    # 4 workers x 10 steps x 1: the mean of their progress (10), or its sum (40)
    assert torch.allclose(_pushes(True), torch.full((100,), 10.0, dtype=torch.float64))
    assert torch.allclose(_pushes(False), torch.full((100,), 40.0, dtype=torch.float64))


@pytest.mark.parametrize("strategy", [
    {"name": "ps"}, {"name": "ssp"}, {"name": "hogwild"}, {"name": "ltfb", "period": 20},
    {"name": "adpsgd"}, {"name": "sgp"},
])
def test_trains_at_the_synchronous_settings(strategy, synthetic, tmp_path):
    """SGD lr 0.05 momentum 0.9 (sim_job's), as allreduce: no tuned rate needed."""
    # ltfb's four models, each at a quarter of the rate, need more steps
    steps = 250 if strategy["name"] == "ltfb" else 150
    result = sim_job(synthetic, tmp_path, strategy, steps=steps).simulate(4)
    assert result.accuracy > 0.6
