"""Asynchronous DiLoCo: lockstep equals DiLoCo, a slow worker does not hold the others back
beyond the staleness bound, bad options, the conformance suite and a GPT smoke run."""


import pytest
import torch

from fastsgd.strategies.lowcomm.async_diloco import AsyncDiLoCo
from fastsgd.testing import check_strategy
from tests.conftest import max_abs_diff
from tests.strategies.helpers import params, refused_in_one_line, sim_job

PATH = "async_diloco"
SLOW = {"compute.slowdown": [1, 1, 1, 3]}


def async_diloco(**options) -> dict:
    return {"name": PATH, **options}


def test_staleness_zero_is_synchronous_diloco(synthetic, tmp_path):
    """Lockstep: one outer step per round on the mean of the round's pseudo-gradients."""
    outer = {"period": 5, "outer_lr": 0.5, "outer_momentum": 0.8}
    want = sim_job(synthetic, tmp_path / "d", {"name": "diloco", **outer}, steps=23).simulate(3)
    got = sim_job(synthetic, tmp_path / "a", async_diloco(staleness=0, **outer),
                  steps=23).simulate(3)
    assert max_abs_diff(params(got), params(want)) < 1e-6
    assert got.summary["consensus_distance"] == 0
    # (the outer optimizer did something: plain local SGD ends elsewhere)
    local = sim_job(synthetic, tmp_path / "l", {"name": "localsgd", "period": 5}, steps=23)
    assert max_abs_diff(params(got), params(local.simulate(3))) > 1e-4


def test_asynchrony_changes_the_arithmetic(synthetic, tmp_path):
    """staleness > 0 applies each push as it comes (at 1/workers): not DiLoCo any more, but
    the replicas still end identical (the final pushes are answered together)."""
    outer = {"period": 5, "outer_lr": 0.5, "outer_momentum": 0.8}
    runs = [sim_job(synthetic, tmp_path / str(s), async_diloco(staleness=s, **outer),
                    steps=23).simulate(3) for s in (0, 2)]
    assert max_abs_diff(params(runs[0]), params(runs[1])) > 1e-4
    assert runs[1].summary["consensus_distance"] == 0


def rounds_by(rows: list[dict], rank: int, time: float) -> int:
    """Rounds `rank` had pushed by simulated `time` (a push is a step that sent bytes; not
    for rank 0, whose server answers count as its bytes)."""
    return sum(1 for m in rows if m["rank"] == rank and m["bytes_sent"] > 0 and m["time"] <= time)


def fast_end(rows: list[dict]) -> float:
    """When the fast workers were done training: their second-last step (the last one
    waits for the slow worker's final push)."""
    last = max(m["step"] for m in rows)
    return max(m["time"] for m in rows if m["rank"] != 3 and m["step"] == last - 1)


def test_a_slow_worker_holds_the_others_back_only_within_the_bound(synthetic, tmp_path):
    """Worker 3 computes 3x slower, 12 rounds of 4 steps, and the quorum is everyone.
    Lockstep (0): everyone waits for it every round. With staleness 1, none is ever more
    than a round ahead of it and the fast workers end sooner; with a bound above the run's
    rounds they are never held back: they end in about a third of the time, when the slow
    one has done a third of its rounds. The run itself ends with its slowest worker, which
    trains run.steps steps (summary's simulated_time)."""
    runs = {s: sim_job(synthetic, tmp_path / str(s),
                       async_diloco(period=4, staleness=s, quorum=1.0), steps=48,
                       **SLOW).simulate(4) for s in (0, 1, 12)}
    rows = {s: r.metrics() for s, r in runs.items()}
    assert max(m["staleness"] for m in rows[0]) == 0
    assert max(m["staleness"] for m in rows[1]) == 1
    assert fast_end(rows[1]) < 0.95 * fast_end(rows[0])
    assert fast_end(rows[12]) < 0.4 * fast_end(rows[0])
    done = fast_end(rows[12])
    assert all(rounds_by(rows[12], r, done) == 11 for r in (1, 2))  # all but the last
    assert rounds_by(rows[12], 3, done) <= 5  # the fast workers did more rounds
    half = fast_end(rows[0]) / 2  # lockstep: the same rounds as the slow one
    assert rounds_by(rows[0], 1, half) == rounds_by(rows[0], 3, half)
    for s in (1, 12):
        assert runs[s].summary["consensus_distance"] == 0
        assert runs[s].summary["idle_steps"] == 0
        assert runs[s].summary["simulated_time"] == pytest.approx(
            runs[0].summary["simulated_time"], rel=0.05)


def test_past_its_quorum_the_run_does_not_wait_for_a_straggler(synthetic, tmp_path):
    """quorum 0.75 of 4 workers: the three fast ones pace the bound and the end. Once
    their final rounds are in, the slow worker's next push is dropped (its round counted
    in dropped_steps) and it trains no more (idle_steps); everyone ends with the same final
    parameters, in about the fast workers' time. Goodput, the share of the cluster's
    compute (3 workers at full speed, one at a third) that reached the final model, is
    over twice the lockstep run's."""
    steps, period = 48, 4
    runs = {name: sim_job(synthetic, tmp_path / name, async_diloco(period=period, **o),
                          steps=steps, **SLOW).simulate(4)
            for name, o in {"lockstep": {"staleness": 0},
                            "quorum": {"staleness": 2, "quorum": 0.75}}.items()}
    lockstep, quorum = runs["lockstep"].summary, runs["quorum"].summary
    assert (lockstep["idle_steps"], lockstep["dropped_steps"]) == (0, 0)
    assert quorum["consensus_distance"] == 0
    assert quorum["idle_steps"] > steps / 2  # the slow worker did about a third of its steps
    assert 0 < quorum["dropped_steps"] <= period

    def goodput(summary: dict) -> float:
        useful = 4 * steps - summary["idle_steps"] - summary["dropped_steps"]
        step_time = runs["lockstep"].summary["simulated_time"] / (3 * steps)  # the slow one's
        return useful / ((3 + 1 / 3) * summary["simulated_time"] / step_time)

    assert goodput(quorum) > 2 * goodput(lockstep), (goodput(quorum), goodput(lockstep))
    assert quorum["simulated_time"] < 0.5 * lockstep["simulated_time"]


def test_it_trains(synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, async_diloco(period=10, outer_lr=0.5,
                                                       outer_momentum=0.5),
                     steps=150, **SLOW).simulate(4)
    assert result.accuracy > 0.6  # chance: 0.1
    assert result.summary["consensus_distance"] == 0


@pytest.mark.parametrize("codec", ["fp16", "qsgd"])
def test_the_push_goes_through_the_codec(codec, synthetic, tmp_path):
    sent = {}
    for name in ("none", codec):
        result = sim_job(synthetic, tmp_path / name, async_diloco(period=5), steps=10,
                         **{"compression.name": name}).simulate(2)
        assert result.summary["consensus_distance"] == 0
        sent[name] = result.summary["bytes_sent_total"]
    assert sent[codec] < 0.8 * sent["none"]  # the push shrinks, the answer does not


@pytest.mark.parametrize("settings, message", [
    ({"staleness": -1}, "strategy.staleness must be >= 0"),
    ({"period": -1}, "strategy.period must be >= 0"),
    ({"outer_lr": 0.0}, "strategy.outer_lr must be > 0"),
    ({"outer_momentum": 1.0}, "strategy.outer_momentum must be"),
])
def test_bad_input_is_one_line_naming_the_key(settings, message, synthetic, tmp_path):
    refused_in_one_line(
        lambda: sim_job(synthetic, tmp_path, async_diloco(**settings), steps=4).simulate(2),
        message)


def test_dgc_is_refused(synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, async_diloco(),
                  **{"compression.name": "dgc", "optimizer.momentum": 0.0})
    refused_in_one_line(lambda: job.simulate(2), "compression.name = 'dgc'")


def test_conformance_asynchronous(tmp_path):
    """Simulated: determinism, bitwise resume mid-run, drain. Not real equals simulated:
    with staleness > 0 the order the server applies pushes in is the order they arrive."""
    ran = check_strategy(PATH, out=tmp_path, period=4, staleness=2)
    assert ran == ["determinism", "resume", "drain"]


@pytest.mark.multiproc
def test_conformance_lockstep_on_real_processes(tmp_path):
    ran = check_strategy(PATH, real=True, out=tmp_path, period=4, staleness=0)
    assert ran == ["determinism", "resume", "drain", "real equals simulated"]


@pytest.mark.multiproc
def test_real_processes_asynchronous_end_identical(synthetic, tmp_path):
    result = sim_job(synthetic, tmp_path, async_diloco(period=5, staleness=1),
                     steps=30).run(2)
    assert result.summary["mode"] == "real"
    assert result.summary["consensus_distance"] < 1e-10


@pytest.mark.parametrize("nesterov", [True, False])
def test_the_momentum_term_alone_leaves_buffers_at_their_mean(nesterov):
    """With staleness, each push moves the global parameters by its own change, and the
    momentum term follows once a round: BatchNorm's running statistics (buffers) are the
    workers' plain mean (params.buffer_mask), which that term must not move (a running
    variance of mean 0.5 came out 0.05 before, and below zero with larger changes)."""
    strategy = AsyncDiLoCo(staleness=2, outer_lr=0.7, outer_momentum=0.9, nesterov=nesterov)
    strategy._buffers = torch.tensor([False, True])
    state = {"global": torch.tensor([1.0, 0.5]), "momentum": torch.tensor([0.2, 0.0])}
    strategy._step(state, torch.tensor([0.1, 0.3]), momentum_too=True, gradient_too=False)
    assert state["global"][1] == 0.5 and state["momentum"][1] == 0
    assert state["global"][0] < 1.0  # the parameter did take the momentum term
