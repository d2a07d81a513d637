import pytest

import fastsgd as fs
from tests.conftest import max_abs_diff
from tests.strategies.helpers import params, sim_job


def test_localsgd_with_period_one_plain_sgd_is_allreduce(synthetic, tmp_path):
    """Averaging parameters after every plain SGD step = averaging the gradients."""
    plain = {"optimizer.momentum": 0.0}
    local = sim_job(synthetic, tmp_path / "l", {"name": "localsgd", "period": 1}, **plain)
    sync = sim_job(synthetic, tmp_path / "a", {"name": "allreduce"}, **plain)
    assert max_abs_diff(params(local.simulate(4)), params(sync.simulate(4))) < 1e-5


@pytest.mark.parametrize("codec", [None, "topk"])
def test_localsgd_warmup_is_synchronous(codec, synthetic, tmp_path):
    """With a lossy codec and momentum too, where allreduce compresses each step's update
    (momentum correction) and exchanges it after the optimizer's step."""
    warm = sim_job(synthetic, tmp_path / "w", {"name": "localsgd", "period": 1000,
                                               "warmup": 50}, compressor=codec).simulate(4)
    sync = sim_job(synthetic, tmp_path / "a", {"name": "allreduce"},
                   compressor=codec).simulate(4)
    assert max_abs_diff(params(warm), params(sync)) < 1e-5


@pytest.mark.parametrize("strategy", [
    {"name": "localsgd", "period": 4, "warmup": 10},
    {"name": "easgd", "period": 2, "alpha": 0.3},
    {"name": "bmuf", "period": 4},
])
def test_averaging_strategies_train(strategy, synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, strategy, steps=150).simulate(4)
    assert result.accuracy > 0.6
    averaged = strategy["name"] != "easgd"
    assert (result.summary["consensus_distance"] < 1e-10) == averaged  # last step averages


def test_averaging_moves_parameters_once_per_period(synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": "localsgd", "period": 5}, steps=20).simulate(2)
    sending = sorted({m["step"] for m in result.metrics() if m["bytes_sent"] > 0})
    assert sending == [5, 10, 15, 20]


def test_easgd_with_a_near_exact_codec_moves_like_easgd_without_one(synthetic, tmp_path):
    """fp16 carries the distances to the centre almost exactly: the centre moves by alpha
    times their sum, computed before the workers move (Zhang et al. 2015), as without a
    codec (from the moved workers, it moved 1 - alpha as far: 2e-2 apart after 60 steps)."""
    strategy = {"name": "easgd", "period": 2, "alpha": 0.3}
    exact = sim_job(synthetic, tmp_path / "a", strategy, steps=60).simulate(4)
    fp16 = sim_job(synthetic, tmp_path / "b", strategy, steps=60,
                   **{"compression.name": "fp16"}).simulate(4)
    assert max_abs_diff(params(exact), params(fp16)) < 5e-3


def test_easgd_refuses_an_alpha_that_drives_the_centre_away(synthetic, tmp_path):
    """The gap between the workers' mean and the centre is multiplied each round by
    1 - (n + 1) alpha: alpha 0.1 at 20 workers is -1.1, and it grows."""
    job = sim_job(synthetic, tmp_path, {"name": "easgd", "alpha": 0.1}, steps=8)
    with pytest.raises(fs.UserError, match=r"^strategy.alpha = 0.1 with 20 workers: the centre "
                                           r"and the workers would drift apart .* take 0.045"):
        job.simulate(20)


def test_easgds_default_alpha_follows_the_workers(synthetic, tmp_path):
    """0.1 up to 9 workers, then 0.9 / n: 24 workers train where 0.1 would diverge."""
    result = sim_job(synthetic, tmp_path, {"name": "easgd", "period": 2}, steps=100,
                     batch=8).simulate(24)
    assert result.accuracy > 0.6
