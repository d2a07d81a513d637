"""NoLoCo: the pairings, the outer step against the paper's rule, the mean of the outer
parameters kept, two workers against plain torch, bad input, faults, conformance, the GPT."""

import pytest
import torch

import fastsgd as fs
from fastsgd.compress import Identity
from fastsgd.strategies import Context
from fastsgd.strategies.base import scaled_period
from fastsgd.strategies.lowcomm.noloco import NoLoCo
from fastsgd.testing import check_strategy
from fastsgd.transport.sim import simulate
from tests.strategies.helpers import params, refused_in_one_line, sim_job

NOLOCO = "noloco"
DIM = 50
ALPHA, BETA, GAMMA = 0.5, 0.7, 0.7  # the defaults
INNER_LR = 0.1


def rounds(workers: int, count: int, **options):
    """Every worker's (phi, delta, theta) before each round and (phi, delta) after it: the
    workers start apart, and each round's inner steps are a random move of their own."""

    def worker(t):
        gen = torch.Generator().manual_seed(t.rank)
        param = torch.nn.Parameter(torch.randn(DIM, generator=gen, dtype=torch.float64))
        strategy = NoLoCo(period=1, **options)
        ctx = Context(t, Identity(), total_steps=count + 1)
        state = strategy.init([param], ctx)
        seen = []
        for step in range(count):
            ctx.step = step
            phi, delta = state["outer"].clone(), state["momentum"].clone()
            with torch.no_grad():
                param.add_(torch.randn(DIM, generator=gen, dtype=torch.float64))
            theta = param.detach().clone()
            strategy.on_parameters([param], state, ctx)
            assert torch.equal(param.detach(), state["outer"])  # inner steps restart at phi
            seen.append((phi, delta, theta, state["outer"].clone(), state["momentum"].clone()))
        return seen

    return simulate(workers, worker)


def test_pairings_are_perfect_matchings_drawn_per_round():
    strategy = NoLoCo(seed=3)
    for n in (2, 4, 6):
        for step in range(10):
            peers = [strategy.peer(r, n, step) for r in range(n)]
            assert all(peers[p] == r != p for r, p in enumerate(peers))
    assert len({tuple(strategy.peer(r, 8, s) for r in range(8)) for s in range(10)}) > 5
    for step in range(10):  # odd: exactly one worker alone, the others paired
        peers = [strategy.peer(r, 5, step) for r in range(5)]
        assert peers.count(None) == 1
        assert all(peers[p] == r for r, p in enumerate(peers) if p is not None)


@pytest.mark.parametrize("workers", [4, 3])
def test_each_step_is_the_paper_rule_and_the_mean_moves_by_the_mean_step(workers):
    """Invariant, per round t, over all workers (to 1e-6; float64 gives ~1e-15):
    mean phi_{t+1} = mean phi_t + mean delta_t, with
    mean delta_t = alpha mean delta_{t-1} - beta mean (phi_t - theta_t): the correction
    terms cancel. And each worker's step is the rule with its pair's means."""
    count = 6
    seen = rounds(workers, count, seed=1)
    strategy = NoLoCo(seed=1)
    for step in range(count):
        phi, delta, theta, phi_after, delta_after = (torch.stack([w[step][k] for w in seen])
                                                     for k in range(5))
        mean_delta = ALPHA * delta.mean(0) - BETA * (phi - theta).mean(0)
        assert float((delta_after.mean(0) - mean_delta).abs().max()) < 1e-6
        assert float((phi_after.mean(0) - phi.mean(0) - mean_delta).abs().max()) < 1e-6
        for r in range(workers):
            peer = strategy.peer(r, workers, step)
            group = [r] if peer is None else [r, peer]
            want = (ALPHA * delta[r] - BETA * (phi[group] - theta[group]).mean(0)
                    - GAMMA * (phi[r] - phi[group].mean(0)))
            assert float((delta_after[r] - want).abs().max()) < 1e-12
            assert float((phi_after[r] - phi[r] - want).abs().max()) < 1e-12
    assert float((phi_after[0] - phi_after[1]).abs().max()) > 1e-3  # no consensus midway


def test_the_last_round_ends_in_consensus_on_the_mean():
    seen = rounds(4, 3, seed=2)  # total_steps = 4: step 3 would be the last; stop before
    final = NoLoCo(seed=2)

    def worker(t):
        param = torch.nn.Parameter(seen[t.rank][-1][3].clone())
        ctx = Context(t, Identity(), step=9, total_steps=10)
        state = final.init([param], ctx)
        state["momentum"] = seen[t.rank][-1][4].clone()
        final.on_parameters([param], state, ctx)  # the last step: theta = phi, Delta = 0
        return param.detach().clone()

    got = simulate(4, worker)
    phis = torch.stack([w[-1][3] for w in seen])
    deltas = torch.stack([w[-1][4] for w in seen])
    want = phis.mean(0) + ALPHA * deltas.mean(0)
    assert all(torch.equal(g, got[0]) for g in got)
    assert float((got[0] - want).abs().max()) < 1e-12


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 2)).double()


def inner_step(model, optimizer, rank, step) -> None:
    gen = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(5, 2, generator=gen, dtype=torch.float64)
    optimizer.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    optimizer.step()


def test_two_workers_are_heavy_ball_sgd_on_the_mean_pseudo_gradient():
    """With 2 workers the pair is the group: phi_0 = phi_1 always, and the outer step is
    torch.optim.SGD(lr=beta, momentum=alpha) on a copy of phi whose grad is the mean of
    phi - theta (delta = -beta * SGD's buffer). Period 3 over 8 steps: rounds after steps
    3, 6 and the last, 8."""
    steps, period = 8, 3

    def worker(t):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=INNER_LR)
        replica = fs.Replica(model, t, NoLoCo(period=period), total_steps=steps)
        for step in range(steps):
            inner_step(model, optimizer, t.rank, step)
            replica.sync_gradients()
            replica.sync_parameters()
        return [p.detach().clone() for p in model.parameters()]

    got = simulate(2, worker)
    models = [tiny_model() for _ in range(2)]
    inner = [torch.optim.SGD(m.parameters(), lr=INNER_LR) for m in models]
    phi = [p.detach().clone().requires_grad_() for p in models[0].parameters()]
    outer = torch.optim.SGD(phi, lr=BETA, momentum=ALPHA)
    for step in range(steps):
        for rank in range(2):
            inner_step(models[rank], inner[rank], rank, step)
        if (step + 1) % period == 0 or step == steps - 1:
            for i, g in enumerate(phi):
                g.grad = sum(g.detach() - list(m.parameters())[i].detach() for m in models) / 2
            outer.step()
            with torch.no_grad():
                for m in models:
                    for p, g in zip(m.parameters(), phi):
                        p.copy_(g)
    want = [g.detach() for g in phi]
    for mine in got:
        assert max(float((a - b).abs().max()) for a, b in zip(mine, want)) < 1e-12


def test_period_zero_scales_to_the_run():
    assert [scaled_period(50, s) for s in (None, 4, 24, 160, 400, 10_000)] == [50, 1, 3, 20, 50, 50]


def test_one_vector_each_way_per_round(synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": NOLOCO, "period": 4}, steps=12).simulate(4)
    sent = {m["step"]: m["bytes_sent"] for m in result.metrics() if m["rank"] == 0}
    model = sum(t.numel() for t in params(result).values())
    assert sent[4] == sent[8] == model * 4 and sent[1] == sent[2] == 0
    assert sent[12] > model * 4  # the last round, then the all-reduce of the average


def test_noloco_trains_and_ends_in_consensus(synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": NOLOCO, "period": 10}, steps=120).simulate(4)
    assert result.accuracy > 0.65  # chance: 0.1
    assert result.summary["consensus_distance"] < 1e-10
    apart = sim_job(synthetic, tmp_path / "a", {"name": NOLOCO, "period": 10,
                                                "average_at_end": False}, steps=40).simulate(4)
    assert apart.summary["consensus_distance"] > 0


@pytest.mark.parametrize("settings, message", [
    ({"outer_lr": 0.0}, "strategy.outer_lr must be > 0"),
    ({"outer_momentum": 1.0}, r"strategy.outer_momentum must be in \[0, 0.999\]"),
    ({"correction": -0.1}, "strategy.correction must be >= 0"),
    ({"period": -1}, "strategy.period must be >= 0"),
])
def test_bad_input_is_one_line_naming_the_key(settings, message, synthetic, tmp_path):
    refused_in_one_line(
        lambda: sim_job(synthetic, tmp_path, {"name": NOLOCO, **settings}, steps=4).simulate(2),
        message)


def test_a_lossy_codec_is_refused(synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": NOLOCO}, **{"compression.name": "fp16"})
    refused_in_one_line(lambda: job.simulate(2), "compression.name = 'fp16'")


def test_survivors_carry_on_after_a_crash_and_repeat_bitwise(tmp_path):
    from fastsgd.workloads.data import load_dataset

    def run(out):
        options = {"run.steps": 60, "data.batch_size": 16, "run.out": str(out),
                   "run.eval_every": 0, "compute.model": "fixed", "compute.step_time": "3ms",
                   "faults.crash": [{"worker": 2, "step": 22}], "faults.detect": "50ms",
                   "strategy.name": NOLOCO, "strategy.period": 5}
        return fs.Job(model="mlp", data=load_dataset("digits", seed=0), options=options,
                      quiet=True).simulate(4)

    first, second = run(tmp_path / "a"), run(tmp_path / "b")
    assert [w["worker"] for w in first.summary["lost_workers"]] == [2]
    assert first.summary["consensus_distance"] < 1e-10
    assert first.summary["final_accuracy"] > 0.8
    assert (first.run_dir / "model.pt").read_bytes() == (second.run_dir / "model.pt").read_bytes()


@pytest.mark.multiproc
def test_conformance_suite_real_equals_simulated(tmp_path):
    ran = check_strategy(NOLOCO, real=True, out=tmp_path, period=5)
    assert ran == ["determinism", "resume", "drain", "real equals simulated"]
