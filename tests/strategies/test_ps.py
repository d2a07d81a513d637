"""Downpour parameter server: one worker with n_push = n_fetch = 1 is plain local SGD."""

import pytest
import torch

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
    # at the synchronous settings (lr 0.05, momentum 0.9): the server averages the pushes and
    # the workers' momentum is cut for the asynchrony (adapt_optimizer, the default)
    job = sim_job(synthetic, tmp_path, strategy, steps=150, **{
        "network.jitter": "2ms", "compute.slowdown": [1, 1, 1, 3]})
    result = job.simulate(4)
    assert result.accuracy > 0.55
    assert max(m["staleness"] for m in result.metrics()) >= 1


def test_a_rate_tuned_for_the_summing_server_still_trains_without_adaptation(synthetic,
                                                                             tmp_path):
    # before adapt_optimizer: the server adds up every worker's steps, so a smaller rate
    # than synchronous SGD's (the settings this test used to pass alone)
    job = sim_job(synthetic, tmp_path, {"name": "ps", "adapt_optimizer": False}, steps=150,
                  **{"network.jitter": "2ms", "compute.slowdown": [1, 1, 1, 3],
                     "optimizer.lr": 0.02})
    result = job.simulate(4)
    assert result.accuracy > 0.55


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy, options", [
    ({}, {}),  # the synchronous settings, adapted (the default)
    # asynchrony on real processes depends on the machine's load: staleness-aware rate, at
    # the rate tuned for the summing server before adapt_optimizer
    ({"staleness_lr": True, "adapt_optimizer": False}, {"optimizer.lr": 0.02}),
])
def test_ps_on_real_processes(strategy, options, synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": "ps", "servers": 2, **strategy},
                     steps=150, **options).run(4)
    assert result.accuracy > 0.5


@pytest.mark.multiproc
def test_one_real_worker_is_local_sgd(synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": "ps"}, batch=64)
    reference = reference_sgd(synthetic, batch_size=64, steps=50)
    assert max_abs_diff(params(job.run(1)), reference) < 1e-5


def _conservation(t):
    """Random optimizer steps; at the end the server holds the start plus every push."""
    import torch

    from fastsgd.compress import Identity
    from fastsgd.strategies import Context
    from fastsgd.strategies.ps import ParameterServer

    p = torch.nn.Parameter(torch.zeros(1000, dtype=torch.float64))
    # every push applied as it came (the server's 1/n is tested in test_staleness.py)
    strategy = ParameterServer(servers=2, adapt_optimizer=False)
    ctx = Context(t, Identity(), total_steps=40)
    state = strategy.init([p], ctx)
    rng = torch.Generator().manual_seed(t.rank)
    moved = torch.zeros_like(p)
    for step in range(40):
        ctx.step = step
        change = torch.randn(1000, generator=rng, dtype=torch.float64)
        with torch.no_grad():
            p += change
        moved += change
        strategy.on_parameters([p], state, ctx)
    t.all_reduce(moved)
    t.barrier()
    shard = state.get("shard")
    return moved, shard, p.detach().clone()


def _check_conservation(results):
    moved = results[0][0]
    server = torch.cat([results[0][1], results[1][1]])
    assert torch.allclose(server, moved, atol=1e-9)  # started at zero


def test_the_servers_hold_every_push_simulated():
    from fastsgd.transport.sim import ComputeModel, Heterogeneity, Network, simulate

    net = Network.parse("1Gbit", "1ms", jitter="3ms")
    stragglers = ComputeModel(spread=Heterogeneity((1.0, 2.0, 1.0, 5.0)))
    _check_conservation(simulate(4, _conservation, net, stragglers))


@pytest.mark.multiproc
def test_the_servers_hold_every_push_on_real_processes(tmp_path):
    from fastsgd.launch.local import launch
    from fastsgd.transport.torch_dist import TorchTransport

    def body():
        t = TorchTransport("gloo", timeout=60)
        try:
            torch.save(_conservation(t), tmp_path / f"{t.rank}.pt")
        finally:
            t.close()

    launch(body, 4)
    _check_conservation([torch.load(tmp_path / f"{r}.pt") for r in range(4)])
