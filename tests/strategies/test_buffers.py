"""Buffers (BatchNorm's running statistics) move with the parameters, per strategy family."""

import pytest
import torch

from fastsgd.loop.replica import Replica
from fastsgd.transport.sim import simulate
from fastsgd.workloads.data import test_batches
from fastsgd.workloads.models import build_model
from tests.strategies.helpers import params, sim_job


def _bn_step(strategy: str):
    """Each worker normalizes its own data (mean = its rank) and syncs once."""

    def worker(t):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        replica = Replica(model, t, strategy, total_steps=1, optimizer=optimizer)
        x = torch.randn(8, 3, generator=torch.Generator().manual_seed(t.rank)) + 10 * t.rank
        model(x).square().mean().backward()
        replica.sync_gradients()
        optimizer.step()
        replica.sync_parameters()
        bn = model[1]
        return bn.running_mean.clone(), bn.running_var.clone()

    return simulate(3, worker)


def _own_statistics():
    """What each worker's BatchNorm holds after the step, with nothing synced."""
    return _bn_step("ssp")


@pytest.mark.parametrize("strategy", ["allreduce", "localsgd", "diloco"])
def test_every_worker_ends_with_the_mean_of_the_workers_statistics(strategy):
    own = _own_statistics()
    assert not torch.equal(own[0][0], own[1][0])  # they did differ
    expected = [sum(o[i] for o in own) / 3 for i in range(2)]
    for mean, var in _bn_step(strategy):
        assert torch.allclose(mean, expected[0], atol=1e-5)
        assert torch.allclose(var, expected[1], atol=1e-4)


@pytest.mark.parametrize("strategy, steps", [
    ({"name": "allreduce"}, 40), ({"name": "dpsgd"}, 40), ({"name": "sgp"}, 40),
    ({"name": "localsgd", "period": 4}, 40),
    ({"name": "diloco", "period": 10}, 80),  # 40 steps: 4 outer steps, 16% (allreduce: 36%)
])
def test_resnet20_trains_and_its_saved_model_is_what_was_evaluated(strategy, steps,
                                                                   synthetic, tmp_path):
    """Short runs on the synthetic set (10 classes); every running variance stays positive
    (an outer Nesterov step on it would overshoot below zero) and the saved representative,
    buffers included, scores what the run reported."""
    job = sim_job(synthetic, tmp_path, strategy, steps=steps, model="resnet20")
    result = job.simulate(4)
    assert result.accuracy > 0.25  # 10 classes
    model = build_model("resnet20", synthetic.input_shape, synthetic.num_classes)
    state = params(result)
    assert any("running_var" in k for k in state)
    assert all(float(v.min()) > 0 for k, v in state.items() if "running_var" in k)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x).argmax(1) == y).sum())
                      for x, y in test_batches(synthetic.test_x, synthetic.test_y))
    assert correct / len(synthetic.test_y) == result.accuracy
