"""Downpour parameter server: one worker with n_push = n_fetch = 1 is plain local SGD."""

import pytest

from tests.conftest import max_abs_diff, reference_sgd
from tests.strategies.helpers import params, sim_job


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_one_worker_push_fetch_every_step_is_local_sgd(momentum, synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": "ps", "n_push": 1, "n_fetch": 1}, batch=64,
                  **{"optimizer.momentum": momentum})
    reference = reference_sgd(synthetic, batch_size=64, steps=50, momentum=momentum)
    assert max_abs_diff(params(job.simulate(1)), reference) < 1e-5


@pytest.mark.parametrize("strategy", [
    {"name": "ps"}, {"name": "ps", "servers": 2, "n_push": 2, "n_fetch": 3},
    {"name": "ps", "staleness_lr": True},
])
def test_ps_trains_with_stragglers_and_jitter(strategy, synthetic, tmp_path):
    # the server adds up every worker's steps: a smaller rate than synchronous SGD's
    job = sim_job(synthetic, tmp_path, strategy, steps=150, **{
        "network.jitter": "2ms", "run.slowdown": [1, 1, 1, 3], "optimizer.lr": 0.02})
    result = job.simulate(4)
    assert result.accuracy > 0.55
    assert max(m["staleness"] for m in result.metrics()) >= 1


@pytest.mark.multiproc
def test_ps_on_real_processes(synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": "ps", "servers": 2}, steps=100,
                     **{"optimizer.lr": 0.02}).run(4)
    assert result.accuracy > 0.5


@pytest.mark.multiproc
def test_one_real_worker_is_local_sgd(synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": "ps"}, batch=64)
    reference = reference_sgd(synthetic, batch_size=64, steps=50)
    assert max_abs_diff(params(job.run(1)), reference) < 1e-5
