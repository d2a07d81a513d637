"""D-PSGD on incomplete topologies (Lian et al. 2017; the FAST paper's 2D torus)."""

import re

import pytest
import torch

import fastsgd as fs
from fastsgd.compress import Identity
from fastsgd.strategies import Context
from fastsgd.strategies.gossip import DPSGD
from fastsgd.topology.build import build_topology
from fastsgd.transport.sim import simulate
from tests.strategies.helpers import sim_job

DIM = 2000


def gossip_only(topology: str, n: int, rounds: int, **graph):
    """Replicas start apart; D-PSGD mixes with no gradients at all."""

    def worker(t):
        gen = torch.Generator().manual_seed(t.rank)
        param = torch.nn.Parameter(torch.randn(DIM, generator=gen, dtype=torch.float64))
        strategy = DPSGD(topology=topology, **graph)
        ctx = Context(t, Identity())
        strategy.init([param], ctx)
        history = [param.detach().clone()]
        for step in range(rounds):
            ctx.step = step
            strategy.on_parameters([param], {}, ctx)
            history.append(param.detach().clone())
        return torch.stack(history)

    return torch.stack(simulate(n, worker))  # (workers, rounds + 1, DIM)


def consensus(replicas: torch.Tensor) -> torch.Tensor:
    """Mean squared distance of the replicas to their average, per round."""
    return ((replicas - replicas.mean(0)) ** 2).sum(-1).mean(0)


@pytest.mark.parametrize("topology, n, graph", [
    ("ring", 8, {}), ("torus", 16, {}), ("exponential", 8, {}),
    ("random", 10, {"degree": 3, "weights": "metropolis"}),
])
def test_doubly_stochastic_mixing_keeps_the_average_and_contracts_at_lambda2(
        topology, n, graph):
    replicas = gossip_only(topology, n, rounds=40, **graph)
    averages = replicas.mean(0)
    assert torch.allclose(averages, averages[0].expand_as(averages), atol=1e-12)
    lam2 = build_topology(topology, n, **{k: v for k, v in graph.items() if k != "weights"},
                          weighting=graph.get("weights", "uniform")).second_eigenvalue()
    d = consensus(replicas)
    d = d[d > 1e-20 * d[0]]  # above float64 round-off
    assert (d[1:] <= d[:-1]).all()
    rates = (d[1:] / d[:-1])[len(d) // 2:]  # after the transient: lambda2^2 per round
    assert rates.mean().item() == pytest.approx(lam2 ** 2, rel=0.03)


def test_dpsgd_trains_on_the_paper_torus(synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": "dpsgd", "topology": "torus"},
                     steps=150).simulate(4)
    assert result.accuracy > 0.6 and result.summary["topology"] == "torus"
    assert result.summary["consensus_distance"] > 0  # incomplete communication


def test_a_torus_that_does_not_fit_fails_before_training(synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": "dpsgd", "topology": "torus", "rows": 3})
    with pytest.raises(fs.UserError, match="strategy.rows"):
        job.simulate(8)


@pytest.mark.multiproc
def test_dpsgd_on_real_processes_equals_the_simulator(synthetic, tmp_path):
    from tests.conftest import max_abs_diff
    from tests.strategies.helpers import params

    job = sim_job(synthetic, tmp_path / "r", {"name": "dpsgd", "topology": "ring"}, steps=30)
    real = job.run(workers=4)
    sim = sim_job(synthetic, tmp_path / "s", {"name": "dpsgd", "topology": "ring"},
                  steps=30).simulate(4)
    assert max_abs_diff(params(real), params(sim)) < 1e-5


def test_the_default_consensus_step_shrinks_with_the_codec_and_draws_nothing():
    """strategy.gamma = 0 (the default): 2.5 times the codec's share of the bytes, or half
    the share of a Gaussian's energy it keeps if smaller, at most 0.5 (CHOCO's step shrinks
    with the codec's quality); measuring it leaves the random streams as they were."""
    from fastsgd.compress import build_compressor
    from fastsgd.strategies.gossip import auto_gamma

    like = torch.zeros(100_000)
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    steps = {name: auto_gamma(build_compressor({"name": name}), like)
             for name in ("topk", "randomk", "dgc", "onebit", "qsgd", "fp16")}
    assert torch.equal(torch.random.get_rng_state(), before)
    # 2% of the values, with their indices (2.5 times: 0.10), keep 14.4% of a Gaussian's
    # energy: half of that
    assert abs(steps["topk"] - 0.144 / 2) < 0.003
    # its indices come from a seed (1/50 of the bytes): half the energy it keeps, its ratio
    assert abs(steps["randomk"] - 0.02 / 2) < 0.002
    wide = auto_gamma(build_compressor({"name": "randomk", "ratio": 0.1}), like)
    assert abs(wide - 0.05) < 0.003  # 2.5 times its bytes would be 0.25: gossip diverged
    assert abs(steps["onebit"] - 2.5 * 0.04) < 0.005  # its bytes: 1.25 bits an element
    assert steps["randomk"] < steps["dgc"] * 3 and steps["topk"] < steps["qsgd"] < 0.5
    assert abs(steps["fp16"] - 0.5) < 1e-6  # half the bytes, all the energy: capped


@pytest.mark.parametrize("strategy", ["dpsgd", "sgp"])
@pytest.mark.parametrize("edges, shown", [([0, 1], "0"), ([[0, [1]]], "[0, [1]]")])
def test_custom_edges_of_the_wrong_shape_are_one_line(strategy, edges, shown):
    job = fs.Job(options={"data.name": "digits", "model.name": "mlp", "run.workers": 2,
                          "run.steps": 2, "strategy.name": strategy,
                          "strategy.topology": "custom", "strategy.edges": edges})
    with pytest.raises(fs.UserError, match=re.escape(f"custom: strategy.edges[0] = {shown} must "
                                                  "be [a, b] with two different ranks")):
        job.simulate()
