"""Codecs on the messages of every strategy: training, invariants, bytes and saved state."""


import pytest
import torch

import fastsgd as fs
from fastsgd.compress import build_compressor
from fastsgd.strategies import Context, build_strategy
from fastsgd.strategies.gossip import DPSGD
from fastsgd.transport.sim import simulate
from tests.strategies.helpers import assert_resumes_bitwise, sim_job

DIM = 3000


@pytest.mark.parametrize("codec", ["topk", "onebit", "qsgd"])
def test_choco_gossip_keeps_the_average_and_reaches_consensus(codec):
    """Compressed D-PSGD (CHOCO) with zero gradients: the average never moves, the spread
    shrinks."""

    def worker(t):
        param = torch.nn.Parameter(torch.randn(DIM, generator=torch.Generator().manual_seed(
            t.rank), dtype=torch.float64))
        start = param.detach().clone()
        ctx = Context(t, build_compressor({"name": codec, "ratio": 0.1} if codec == "topk"
                                          else {"name": codec}))
        strategy = DPSGD(topology="ring", gamma=0.3)
        with torch.no_grad():  # every replica starts equal, then is pushed apart
            param.zero_()
        state = strategy.init([param], ctx)
        with torch.no_grad():
            param.copy_(start)
        for step in range(300):
            ctx.step = step
            strategy.on_parameters([param], state, ctx)
        return start, param.detach().clone()

    starts, ends = zip(*simulate(6, worker))
    starts, ends = torch.stack(starts), torch.stack(ends)
    assert torch.allclose(ends.mean(0), starts.mean(0), atol=1e-9)
    spread = lambda x: ((x - x.mean(0)) ** 2).sum(-1).mean()  # noqa: E731
    assert spread(ends) < 0.05 * spread(starts)


@pytest.mark.parametrize("strategy, codec", [
    ("allreduce", "onebit"), ("allreduce", "topk"), ("allreduce", "powersgd"),
    ("allreduce", "qsgd"), ("ssp", "sign"), ("localsgd", "topk"), ("easgd", "fp16"),
    ("bmuf", "qsgd"), ("dpsgd", "topk"), ("ps", "topk"), ("ps", "onebit"),
    ("adpsgd", "topk"), ("adpsgd", "onebit"), ("sgp", "topk"), ("sgp", "qsgd"),
    ("ltfb", "fp16"), ("ltfb", "qsgd"),
])
def test_strategies_train_with_a_codec(strategy, codec, synthetic, tmp_path):
    """10 classes (chance: 10%); uncompressed allreduce reaches 59% in these 150 steps."""
    options = {"compression.name": codec, "optimizer.momentum": 0.0, "optimizer.lr": 0.1}
    if codec == "topk":
        options["compression.ratio"] = 0.1
    if strategy == "ltfb":  # lr / 4 per model (adapt_optimizer): too slow for 150 steps
        options["strategy.adapt_optimizer"] = False
    if strategy == "sgp":  # a push moves gamma of its share: small with a sparse codec
        options["strategy.gamma"] = 0.1 if codec == "topk" else 0.5
    job = sim_job(synthetic, tmp_path, {"name": strategy}, steps=150, **options)
    result = job.simulate(4)
    assert result.accuracy > 0.45
    assert result.summary["compressor"] == codec


def test_compression_shrinks_the_bytes_of_a_run(synthetic, tmp_path):
    sent = {}
    for codec in ("none", "topk"):
        job = sim_job(synthetic, tmp_path / codec, {"name": "allreduce"}, steps=5,
                      **{"compression.name": codec})
        sent[codec] = job.simulate(4).summary["bytes_sent_total"]
    assert sent["topk"] < sent["none"] / 10


@pytest.mark.parametrize("strategy", ["hogwild"])
def test_a_codec_a_strategy_cannot_carry_is_refused_by_name(strategy, synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": strategy}, **{"compression.name": "topk"})
    with pytest.raises(fs.UserError, match=f"compression.name = 'topk'.*'{strategy}'"):
        job.simulate(2)


def test_dgc_with_the_optimizer_momentum_too_is_refused(synthetic, tmp_path):
    """DGC's own momentum replaces the optimizer's; both would diverge. (By default dgc
    leaves the momentum to the optimizer, and allreduce's correction compresses its update.)"""
    job = sim_job(synthetic, tmp_path, {"name": "allreduce"},
                  **{"compression.name": "dgc", "compression.momentum": 0.9,
                     "optimizer.momentum": 0.9})
    with pytest.raises(fs.UserError, match="set optimizer.momentum = 0"):
        job.simulate(2)


@pytest.mark.parametrize("strategy, codec", [
    ("allreduce", "dgc"), ("allreduce", "onebit"), ("allreduce", "powersgd"),
    ("dpsgd", "topk"), ("localsgd", "sign"),
])
def test_codec_state_is_saved_and_restored_with_the_worker(strategy, codec):
    """Stopping after 6 steps, saving, and resuming in fresh objects gives exactly the
    parameters of 12 uninterrupted steps: residuals, momentum and counters were kept."""

    def replica(t):
        torch.manual_seed(0)
        model = torch.nn.Linear(20, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        settings = {"name": strategy, **({"period": 2} if strategy == "localsgd" else {})}
        return model, optimizer, fs.Replica(model, t, build_strategy(settings),
                                           build_compressor({"name": codec}), total_steps=12)

    def steps(t, model, optimizer, rep, first, last):
        for step in range(first, last):
            gen = torch.Generator().manual_seed(100 * step + t.rank)
            x, y = torch.randn(8, 20, generator=gen), torch.randint(0, 3, (8,), generator=gen)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            rep.sync_gradients()
            optimizer.step()
            rep.sync_parameters()

    assert_resumes_bitwise(4, replica, steps)
