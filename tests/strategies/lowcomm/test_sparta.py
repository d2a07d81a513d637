"""SPARTA: exactly the chosen entries are averaged, the workers' mean is kept, fraction 1 is
parameter averaging every step, codecs, bad input, conformance and the GPT."""

import pytest
import torch

import fastsgd as fs
from fastsgd.compress import Identity, build_compressor
from fastsgd.strategies import Context
from fastsgd.strategies.lowcomm.sparta import SEED_STRIDE, Sparta
from fastsgd.testing import check_strategy
from fastsgd.transport.sim import simulate
from tests.conftest import max_abs_diff
from tests.strategies.helpers import params, refused_in_one_line, sim_job

SPARTA = "sparta"
SIZES = (7, 13, 12)  # three tensors, 32 entries


def one_step(workers: int, step: int, codec: str = "none", last: bool = False, **options):
    """Each worker's tensors before and after one on_parameters: they start alike (as a
    Replica makes them) and each worker then moves its own way."""

    def worker(t):
        ps = [torch.nn.Parameter(torch.zeros(n, dtype=torch.float64)) for n in SIZES]
        strategy = Sparta(**options)
        ctx = Context(t, build_compressor({"name": codec}), step=step,
                      total_steps=step + 1 if last else step + 10)
        state = strategy.init(ps, ctx)
        gen = torch.Generator().manual_seed(t.rank)
        with torch.no_grad():
            for p in ps:
                p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
        before = torch.cat([p.detach().clone() for p in ps])
        strategy.on_parameters(ps, state, ctx)
        return before, torch.cat([p.detach().clone() for p in ps])

    got = simulate(workers, worker)
    return torch.stack([b for b, _ in got]), torch.stack([a for _, a in got])


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("step", [0, 5])
def test_exactly_the_chosen_entries_become_the_workers_mean(step):
    before, after = one_step(3, step, fraction=0.25, seed=4)
    changed = (after != before).any(0)
    want = torch.randperm(32, generator=torch.Generator().manual_seed(4 * SEED_STRIDE + step))
    assert changed.nonzero().view(-1).tolist() == sorted(want[:8].tolist())  # 0.25 * 32
    mean = before.mean(0)
    assert torch.allclose(after[:, changed], mean[changed].expand(3, -1), atol=1e-12, rtol=0)
    assert torch.equal(after[:, ~changed], before[:, ~changed])  # untouched, bit for bit
    assert torch.allclose(after.mean(0), mean, atol=1e-12, rtol=0)  # the global mean is kept


def test_the_choice_changes_with_the_step_and_the_seed():
    strategy = Sparta(fraction=0.1)
    picks = {tuple(strategy.chosen(1000, s).tolist()) for s in range(5)}
    assert len(picks) == 5 and all(len(p) == 100 for p in picks)
    assert torch.equal(Sparta(fraction=0.1, seed=1).chosen(1000, 0),
                       Sparta(fraction=0.1, seed=1).chosen(1000, 0))
    assert not torch.equal(Sparta(fraction=0.1, seed=1).chosen(1000, 0), strategy.chosen(1000, 0))
    assert Sparta(fraction=1e-9).count(1000) == 1  # at least one entry


def test_a_small_fraction_draws_distinct_entries_every_one_as_often():
    """The O(k) draw (k <= N / 8): k distinct sorted indices, each entry about as often as
    any other over many steps (5 of 1000 over 4000 steps: 20 times each on average)."""
    strategy = Sparta(fraction=0.005)
    counts = torch.zeros(1000)
    for step in range(4000):
        picked = strategy.chosen(1000, step)
        assert len(picked.unique()) == 5 and torch.equal(picked, picked.sort().values)
        counts[picked] += 1
    assert 5 <= counts.min() and counts.max() <= 40, (counts.min(), counts.max())
    assert 0 in counts.nonzero() and 999 in counts.nonzero()  # no end left out


@pytest.mark.parametrize("codec", ["none", "qsgd"])
def test_the_last_step_averages_everything(codec):
    before, after = one_step(3, 7, codec=codec, last=True, fraction=0.1)
    assert torch.equal(after[0], after[1]) and torch.equal(after[0], after[2])
    assert gap(after[0], before.mean(0)) < 1e-12  # exact, whatever the codec


def test_a_lossy_codec_keeps_the_replicas_equal_on_the_chosen_entries():
    before, after = one_step(3, 2, codec="qsgd", fraction=0.25)
    changed = (after != before).any(0)
    assert int(changed.sum()) == 8
    assert torch.equal(after[0, changed], after[1, changed])
    assert torch.equal(after[0, changed], after[2, changed])
    assert gap(after[:, changed].mean(0), before[:, changed].mean(0)) < 0.5


def test_fraction_one_is_localsgd_every_step(synthetic, tmp_path):
    plain = {"optimizer.momentum": 0.0}
    sparta = sim_job(synthetic, tmp_path / "s", {"name": SPARTA, "fraction": 1.0}, steps=20,
                     **plain)
    local = sim_job(synthetic, tmp_path / "l", {"name": "localsgd", "period": 1}, steps=20,
                    **plain)
    assert max_abs_diff(params(sparta.simulate(3)), params(local.simulate(3))) < 1e-6


def test_bytes_are_the_fraction_of_a_parameter_all_reduce(synthetic, tmp_path):
    rows = sim_job(synthetic, tmp_path, {"name": SPARTA, "fraction": 0.01},
                   steps=6).simulate(2).metrics()
    sent = {r["step"]: r["bytes_sent"] for r in rows if r["rank"] == 0}
    entries = sum(t.numel() for t in params(sim_job(synthetic, tmp_path, {"name": SPARTA},
                                                    steps=1).simulate(2)).values())
    assert sent[6] == entries * 4  # 2 workers: a ring all-reduce sends the vector once
    assert sent[1] == round(0.01 * entries) * 4


@pytest.mark.parametrize("codec", ["none", "qsgd", "topk"])
def test_sparta_trains_and_ends_in_consensus(codec, synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, {"name": SPARTA, "fraction": 0.01}, steps=100,
                     **{"compression.name": codec}).simulate(4 if codec == "none" else 2)
    # chance: 0.1; allreduce: 0.61 on 2 workers, 0.68 on 4 (these 100 steps)
    assert result.accuracy > (0.65 if codec == "none" else 0.55)
    assert result.summary["consensus_distance"] < 1e-10


@pytest.mark.parametrize("settings, message", [
    ({"fraction": 0.0}, r"strategy.fraction must be in \(0, 1\]"),
    ({"fraction": 1.5}, r"strategy.fraction must be in \(0, 1\]"),
    ({"fraction": -0.1}, r"strategy.fraction must be in \(0, 1\]"),
    ({"seed": 0.5}, "strategy.seed must be of type int"),
])
def test_bad_input_is_one_line_naming_the_key(settings, message, synthetic, tmp_path):
    refused_in_one_line(
        lambda: sim_job(synthetic, tmp_path, {"name": SPARTA, **settings}, steps=4).simulate(2),
        message)


@pytest.mark.parametrize("codec", ["dgc", "powersgd"])
def test_codecs_that_cannot_carry_it_are_refused(codec, synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": SPARTA},
                  **{"compression.name": codec, "optimizer.momentum": 0.0})
    refused_in_one_line(lambda: job.simulate(2), f"compression.name = '{codec}'")


def test_survivors_carry_on_after_a_crash(tmp_path):
    from fastsgd.workloads.data import load_dataset

    options = {"run.steps": 60, "data.batch_size": 16, "run.out": str(tmp_path),
               "run.eval_every": 0, "compute.model": "fixed", "compute.step_time": "3ms",
               "faults.crash": [{"worker": 2, "step": 20}], "faults.detect": "50ms",
               "strategy.name": SPARTA, "strategy.fraction": 0.05}
    result = fs.Job(model="mlp", data=load_dataset("digits", seed=0), options=options,
                    quiet=True).simulate(4)
    assert [w["worker"] for w in result.summary["lost_workers"]] == [2]
    assert result.summary["consensus_distance"] < 1e-10
    assert result.summary["final_accuracy"] > 0.8


@pytest.mark.multiproc
def test_conformance_suite_real_equals_simulated(tmp_path):
    ran = check_strategy(SPARTA, real=True, out=tmp_path, fraction=0.05)
    assert ran == ["determinism", "resume", "drain", "real equals simulated"]


def test_conformance_with_a_codec(tmp_path):
    assert "resume" in check_strategy(SPARTA, "qsgd", out=tmp_path, fraction=0.05)


def test_identity_codec_needs_no_state():
    def worker(t):
        return Sparta().init([torch.nn.Parameter(torch.zeros(3))], Context(t, Identity()))

    assert simulate(2, worker) == [{}, {}]
