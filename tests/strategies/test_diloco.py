"""DiLoCo and Streaming DiLoCo: the outer Nesterov step against plain torch, fragments and
overlap, codecs, bad input, checkpoints and real processes."""


import pytest
import torch

import fastsgd as fs
from fastsgd.compress import build_compressor
from fastsgd.strategies.base import scaled_period
from fastsgd.strategies.diloco import DiLoCo, split
from fastsgd.transport.sim import simulate
from tests.conftest import max_abs_diff
from tests.strategies.helpers import assert_resumes_bitwise, params, sim_job

INNER_LR = 0.1


def tiny_model() -> torch.nn.Module:
    """Four parameter tensors of 12, 4, 8 and 2 elements, in float64."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 2)).double()


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return (torch.randn(5, 3, generator=gen, dtype=torch.float64),
            torch.randn(5, 2, generator=gen, dtype=torch.float64))


def inner_step(model, optimizer, rank, step) -> None:
    x, y = batch(rank, step)
    optimizer.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    optimizer.step()


def with_strategy(steps: int, codec: str = "none", **settings) -> list[list[torch.Tensor]]:
    """Two simulated workers, plain SGD inside, the strategy between them."""

    def worker(t):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=INNER_LR)
        replica = fs.Replica(model, t, DiLoCo(**settings), build_compressor({"name": codec}),
                             total_steps=steps)
        for step in range(steps):
            inner_step(model, optimizer, t.rank, step)
            replica.sync_gradients()
            replica.sync_parameters()
        return [p.detach().clone() for p in model.parameters()]

    return simulate(2, worker)


def reference(steps: int, period: int, groups: list[list[int]], outer_lr=0.7, momentum=0.9,
              nesterov=True, overlap=0, alpha=0.5) -> list[list[torch.Tensor]]:
    """Plain torch, both workers in one loop; the outer optimizer is torch.optim.SGD on a
    copy of the global parameters whose .grad is the mean pseudo-gradient of a fragment."""
    models = [tiny_model() for _ in range(2)]
    inner = [torch.optim.SGD(m.parameters(), lr=INNER_LR) for m in models]
    tensors = [list(m.parameters()) for m in models]
    global_ = [p.detach().clone().requires_grad_() for p in tensors[0]]
    outer = torch.optim.SGD(global_, lr=outer_lr, momentum=momentum, nesterov=nesterov)
    pending: dict[int, tuple[int, int, dict[int, torch.Tensor]]] = {}

    def land(f: int, now: int) -> None:
        started, _, mean = pending.pop(f)
        for i, g in enumerate(global_):
            g.grad = mean.get(i)  # None: torch.optim.SGD leaves the tensor alone
        outer.step()
        with torch.no_grad():
            for i in groups[f]:
                for ps in tensors:
                    ps[i].copy_(global_[i] if started == now
                                else alpha * ps[i] + (1 - alpha) * global_[i])

    for step in range(steps):
        for rank in range(2):
            inner_step(models[rank], inner[rank], rank, step)
        last = step == steps - 1
        for f in sorted(pending):
            if pending[f][1] == step or last:
                land(f, step)
        for f in range(len(groups)):
            shift = f * period // len(groups)
            if last or (step + 1 - shift) % period == 0:
                mean = {i: sum(global_[i].detach() - ps[i].detach() for ps in tensors) / 2
                        for i in groups[f]}
                pending[f] = (step, step if last else step + overlap, mean)
                if last or overlap == 0:
                    land(f, step)
    return [[p.detach().clone() for p in ps] for ps in tensors]


def largest_gap(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> float:
    return max(float((x - y).abs().max()) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


@pytest.mark.parametrize("nesterov", [True, False])
def test_two_workers_match_plain_torch_outer_nesterov(nesterov):
    """Period 3 over 7 steps: outer steps after steps 3, 6 and (the last) 7."""
    got = with_strategy(7, period=3, nesterov=nesterov)
    want = reference(7, 3, [[0, 1, 2, 3]], nesterov=nesterov)
    assert largest_gap(got, want) < 1e-6
    assert largest_gap([got[0]], [got[1]]) == 0  # the replicas end identical
    plain = reference(7, 1000, [[0, 1, 2, 3]], outer_lr=1.0, momentum=0.0, nesterov=False)
    assert largest_gap(got, plain) > 1e-3  # (the outer optimizer did something)


@pytest.mark.parametrize("fragments, overlap, alpha", [(2, 0, 0.5), (2, 1, 0.5), (4, 2, 0.3),
                                                       (3, 3, 0.0)])
def test_streaming_fragments_and_overlap_match_plain_torch(fragments, overlap, alpha):
    """Staggered fragments, syncs in flight for `overlap` inner steps then merged with the
    paper's rule; 11 steps so that syncs are still in flight at the last step."""
    period, steps = 4, 11
    groups = [list(range(a, b)) for a, b in split([12, 4, 8, 2], fragments)]
    got = with_strategy(steps, period=period, fragments=fragments, overlap=overlap,
                        alpha=alpha)
    want = reference(steps, period, groups, overlap=overlap, alpha=alpha)
    assert largest_gap(got, want) < 1e-6
    assert largest_gap([got[0]], [got[1]]) == 0


def test_fragments_are_contiguous_and_about_equal():
    assert split([12, 4, 8, 2], 1) == [(0, 4)]
    assert split([12, 4, 8, 2], 2) == [(0, 1), (1, 4)]
    assert split([1, 1, 1, 1, 1, 1], 3) == [(0, 2), (2, 4), (4, 6)]
    assert split([100, 1, 1], 3) == [(0, 1), (1, 2), (2, 3)]  # never empty
    mlp = [200704, 256, 65536, 256, 2560, 10]
    assert split(mlp, 2) == [(0, 1), (1, 6)]


def test_each_fragment_syncs_once_per_period_on_its_own_step(synthetic, tmp_path):
    """MLP, 3 fragments, period 6: fragment p syncs after steps 6k + 2p, so a sync every
    two steps, each about a third of the model; after the last step, all of it."""
    result = sim_job(synthetic, tmp_path / "s", {"name": "diloco", "period": 6,
                                                  "fragments": 3}, steps=23).simulate(2)
    sent = {m["step"]: m["bytes_sent"] for m in result.metrics() if m["rank"] == 0}
    assert {s for s, b in sent.items() if b > 0} == {*range(2, 23, 2), 23}
    whole = sim_job(synthetic, tmp_path / "w", {"name": "diloco", "period": 6},
                    steps=23).simulate(2)
    model = max(m["bytes_sent"] for m in whole.metrics())
    assert sent[2] + sent[4] + sent[6] == model == sent[23]  # fragments 1, 2, 0; then all
    assert max(sent[2], sent[4], sent[6]) < model
    assert result.summary["consensus_distance"] == 0


@pytest.mark.parametrize("strategy", ["diloco", "async_diloco"])
def test_the_default_period_is_the_papers_but_eight_rounds_in_a_shorter_run(strategy, synthetic,
                                                                            tmp_path):
    """period 0: 500 (H in Douillard et al. 2023), but min(500, steps // 8) in a run of fewer
    than 4000 steps: 40 steps here, rounds after steps 5, 10, ..., 40."""
    result = sim_job(synthetic, tmp_path, {"name": strategy}, steps=40).simulate(2)
    sent = sorted({m["step"] for m in result.metrics() if m["rank"] == 1 and m["bytes_sent"]})
    assert sent == list(range(5, 41, 5))
    assert DiLoCo().period == 0  # the config keeps what the user chose
    assert [scaled_period(500, s) for s in (None, 40, 4000, 10**6)] == [500, 5, 500, 500]
    with pytest.raises(fs.UserError, match=r"strategy.overlap must be < strategy.period \(5\)"):
        sim_job(synthetic, tmp_path / "o", {"name": "diloco", "overlap": 5}, steps=40).simulate(2)


def test_outer_lr_one_without_momentum_is_localsgd(synthetic, tmp_path):
    plain = {"optimizer.momentum": 0.0}
    diloco = sim_job(synthetic, tmp_path / "d", {"name": "diloco", "period": 5, "outer_lr": 1.0,
                                                 "outer_momentum": 0.0}, steps=30, **plain)
    local = sim_job(synthetic, tmp_path / "l", {"name": "localsgd", "period": 5}, steps=30,
                    **plain)
    assert max_abs_diff(params(diloco.simulate(4)), params(local.simulate(4))) < 1e-6


# The paper's outer momentum 0.9 is for thousands of outer steps; these runs have 15.
SHORT = {"name": "diloco", "period": 10, "outer_lr": 0.5, "outer_momentum": 0.5}


@pytest.mark.parametrize("strategy", [SHORT, {**SHORT, "fragments": 3, "overlap": 2}])
def test_diloco_trains_and_ends_in_consensus(strategy, synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, strategy, steps=150).simulate(4)
    assert result.accuracy > 0.65  # chance: 0.1; allreduce: 0.77
    assert result.summary["consensus_distance"] < 1e-10


def test_a_simulated_run_repeats_bit_for_bit(synthetic, tmp_path):
    strategy = {"name": "diloco", "period": 5, "fragments": 2, "overlap": 2}
    runs = [sim_job(synthetic, tmp_path / str(i), strategy, steps=20,
                    **{"compression.name": "qsgd"}).simulate(2) for i in range(2)]
    assert (runs[0].run_dir / "model.pt").read_bytes() == \
        (runs[1].run_dir / "model.pt").read_bytes()


@pytest.mark.parametrize("codec, options", [
    ("fp16", {}), ("qsgd", {"compression.levels": 7}),  # 4 bits: sign and 7 levels
    ("sign", {}), ("topk", {"compression.ratio": 0.1}),
])
def test_diloco_trains_with_a_codec(codec, options, synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, SHORT, steps=150, **{"compression.name": codec, **options})
    result = job.simulate(4)
    assert result.accuracy > 0.65
    assert result.summary["compressor"] == codec
    assert result.summary["consensus_distance"] < 1e-10


def test_fp16_halves_the_bytes(synthetic, tmp_path):
    sent = {codec: sim_job(synthetic, tmp_path / codec, {"name": "diloco", "period": 5},
                           steps=10, **{"compression.name": codec}
                           ).simulate(2).summary["bytes_sent_total"] for codec in ("none", "fp16")}
    assert 0.49 < sent["fp16"] / sent["none"] < 0.51  # (plus the scatter's padding)


@pytest.mark.parametrize("settings, message", [
    ({"outer_lr": 0.0}, "strategy.outer_lr must be > 0"),
    ({"outer_lr": -0.5}, "strategy.outer_lr must be > 0"),
    ({"fragments": 0}, "strategy.fragments must be >= 1"),
    ({"fragments": 7}, "strategy.fragments must be <= the model's 6 parameter tensors"),
    ({"period": 4, "overlap": 4}, r"strategy.overlap must be < strategy.period \(4\)"),
    ({"period": 4, "overlap": 9}, r"strategy.overlap must be < strategy.period \(4\)"),
    ({"overlap": -1}, "strategy.overlap must be >= 0"),
    ({"alpha": 1.0}, r"strategy.alpha must be in \[0, 1\)"),
])
def test_bad_input_is_one_line_naming_the_key(settings, message, synthetic, tmp_path):
    with pytest.raises(fs.UserError, match=message) as caught:
        sim_job(synthetic, tmp_path, {"name": "diloco", **settings}, steps=4).simulate(2)
    assert "\n" not in str(caught.value)


def test_checkpoints_with_a_sync_in_flight_are_refused_naming_overlap(synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": "diloco", "period": 4, "overlap": 1}, steps=8,
                  **{"run.checkpoint_every": 4})
    with pytest.raises(fs.UserError, match=r"^strategy.name = 'diloco' with strategy.period = "
                                           r"4, strategy.overlap = 1 cannot be checkpointed"):
        job.simulate(2)


def test_a_codec_that_cannot_carry_a_pseudo_gradient_is_refused(synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": "diloco"},
                  **{"compression.name": "dgc", "optimizer.momentum": 0.0})
    with pytest.raises(fs.UserError, match="compression.name = 'dgc'.*strategy.name = "
                                           "'diloco'") as caught:
        job.simulate(2)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("codec", ["none", "sign"])
def test_state_is_saved_and_restored(codec):
    """Stopping after 6 steps (mid-period), saving, and resuming in fresh objects gives the
    parameters of 12 uninterrupted steps: the global model, the outer momentum and the
    codec's residuals are in the state."""
    settings = {"period": 4, "fragments": 2}

    def replica(t):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=INNER_LR, momentum=0.5)
        return model, optimizer, fs.Replica(model, t, DiLoCo(**settings),
                                           build_compressor({"name": codec}), total_steps=12)

    def steps(t, model, optimizer, rep, first, last):
        for step in range(first, last):
            inner_step(model, optimizer, t.rank, step)
            rep.sync_gradients()
            rep.sync_parameters()

    assert_resumes_bitwise(2, replica, steps)


@pytest.mark.multiproc
def test_real_processes_train_end_identical_and_match_the_simulator(synthetic, tmp_path):
    """Two worker processes, fragments and an overlapped sync (a background gloo
    all-reduce): it trains, the replicas end identical, and the simulator agrees."""
    strategy = {"name": "diloco", "period": 6, "fragments": 3, "overlap": 2}
    real = sim_job(synthetic, tmp_path / "r", strategy, steps=40).run(2)
    assert real.summary["mode"] == "real"
    assert real.accuracy > 0.3  # chance: 0.1
    assert real.summary["consensus_distance"] < 1e-10
    simulated = sim_job(synthetic, tmp_path / "s", strategy, steps=40).simulate(2)
    assert max_abs_diff(params(real), params(simulated)) < 1e-5
    assert real.summary["bytes_sent_total"] == simulated.summary["bytes_sent_total"]
