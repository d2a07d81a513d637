"""Synchronous all-reduce over N workers with batch b equals one worker with batch N*b."""

import contextlib

import pytest
import torch

import fastsgd as fs
from fastsgd.transport.base import ring_allreduce_bytes
from tests.conftest import max_abs_diff, reference_sgd

STEPS = 50


def _job(dataset, out, **options):
    settings = {"run.steps": STEPS, "data.batch_size": 16, "optimizer.lr": 0.05,
                "optimizer.momentum": 0.9, "run.out": str(out), **options}
    return fs.Job(model="mlp", data=dataset, options=settings, quiet=True)


def _params(result):
    return torch.load(result.run_dir / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(synthetic):
    return reference_sgd(synthetic, batch_size=64, steps=STEPS)


@pytest.fixture(scope="module")
def simulated(synthetic, tmp_path_factory):
    return _job(synthetic, tmp_path_factory.mktemp("sim")).simulate(workers=4)


def test_simulated_4x16_equals_1x64(simulated, reference):
    assert max_abs_diff(_params(simulated), reference) < 1e-4


def test_small_buckets_and_no_overlap_give_the_same_result(synthetic, reference, tmp_path):
    job = _job(synthetic, tmp_path, **{"strategy.bucket_mb": 0.01, "strategy.overlap": False})
    assert max_abs_diff(_params(job.simulate(workers=4)), reference) < 1e-4


def test_bytes_per_step_follow_the_ring_rule(simulated, synthetic):
    n_params = sum(p.numel() for p in fs.models.build_model(
        "mlp", synthetic.input_shape, synthetic.num_classes).parameters())
    expected = ring_allreduce_bytes(4 * n_params, 4)
    assert {m["bytes_sent"] for m in simulated.metrics()} == {expected}
    assert simulated.summary["bytes_sent_total"] == 4 * STEPS * expected


@pytest.mark.multiproc
def test_real_processes_equal_reference_and_simulator(synthetic, reference, simulated, tmp_path):
    real = _job(synthetic, tmp_path).run(workers=4)
    assert real.summary["mode"] == "real" and real.summary["workers"] == 4
    assert max_abs_diff(_params(real), reference) < 1e-4
    assert max_abs_diff(_params(real), _params(simulated)) < 1e-5
    assert real.summary["bytes_sent_total"] == simulated.summary["bytes_sent_total"]


def test_buckets_are_sent_while_backward_runs(synthetic):
    """With overlap, each bucket's all-reduce starts from a gradient hook during backward."""
    from fastsgd.transport.sim import simulate

    def worker(t):
        torch.manual_seed(0)
        model = fs.models.build_model("mlp", synthetic.input_shape, synthetic.num_classes)
        strategy = fs.AllReduce(bucket_mb=0.1)
        replica = fs.Replica(model, t, strategy)
        x, y = synthetic.train_x[:8], synthetic.train_y[:8]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        in_flight = [b.handle is not None for b in strategy._buckets]
        replica.sync_gradients()
        return in_flight

    for in_flight in simulate(2, worker):
        assert len(in_flight) >= 2 and all(in_flight)


def _accumulated(synthetic, in_no_sync: bool):
    """Two micro-batches of 8 per worker in one's own loop, then one sync: each worker's
    gradient, and the reference (one process, both workers' 32 samples)."""
    from fastsgd.transport.sim import simulate

    def worker(t):
        torch.manual_seed(0)
        model = fs.models.build_model("mlp", synthetic.input_shape, synthetic.num_classes)
        replica = fs.Replica(model, t, fs.AllReduce(bucket_mb=0.1))
        for k in range(2):
            lo = 16 * t.rank + 8 * k
            x, y = synthetic.train_x[lo:lo + 8], synthetic.train_y[lo:lo + 8]
            with replica.no_sync() if in_no_sync and k == 0 else contextlib.nullcontext():
                (torch.nn.functional.cross_entropy(model(x), y) / 2).backward()
        replica.sync_gradients()
        return [p.grad.clone() for p in model.parameters()]

    return simulate(2, worker)


def test_accumulating_in_no_sync_equals_the_whole_batch(synthetic):
    torch.manual_seed(0)
    model = fs.models.build_model("mlp", synthetic.input_shape, synthetic.num_classes)
    torch.nn.functional.cross_entropy(model(synthetic.train_x[:32]),
                                      synthetic.train_y[:32]).backward()
    for grads in _accumulated(synthetic, in_no_sync=True):
        assert max(float((g - p.grad).abs().max())
                   for g, p in zip(grads, model.parameters())) < 1e-6


def test_a_second_backward_outside_no_sync_is_one_line(synthetic):
    with pytest.raises(fs.UserError, match=r"^a second backward before sync_gradients: .*"
                                           r"`with replica.no_sync\(\):`"):
        _accumulated(synthetic, in_no_sync=False)
