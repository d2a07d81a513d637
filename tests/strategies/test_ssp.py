
from tests.conftest import max_abs_diff
from tests.strategies.helpers import params, sim_job


def test_staleness_zero_is_allreduce(synthetic, tmp_path):
    ssp = sim_job(synthetic, tmp_path / "ssp", {"name": "ssp", "staleness": 0}).simulate(4)
    sync = sim_job(synthetic, tmp_path / "ar", {"name": "allreduce"}).simulate(4)
    assert max_abs_diff(params(ssp), params(sync)) < 1e-5
    assert {m["staleness"] for m in ssp.metrics()} == {0}


def test_bounded_staleness_is_logged_and_replicas_end_identical(synthetic, tmp_path):
    """Plain SGD: every delayed gradient is applied by the last step (Statement 1)."""
    job = sim_job(synthetic, tmp_path, {"name": "ssp", "staleness": 3},
                  **{"optimizer.momentum": 0.0, "run.representative": "rank0"})
    result = job.simulate(4)
    ages = [m["staleness"] for m in result.metrics() if 3 < m["step"] < 50]
    assert set(ages) == {3}
    # equal up to float32 rounding: the same sums, added up in a different order
    assert result.summary["consensus_distance"] < 1e-9


def test_ssp_trains(synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": "ssp", "staleness": 2},
                     steps=150).simulate(4)
    assert result.accuracy > 0.6
