"""summary.json's samples_per_second: every step over the training time (lockstep and
periodic strategies: the last step's synchronization is part of the method's cost); where
an asynchronous drain makes fast workers wait for the slowest, that wait is left out of
each one's time, but not its own messages still queued (results.py, _rate)."""

from collections import defaultdict
from types import SimpleNamespace

import pytest

import fastsgd as fs
from fastsgd.loop.results import _rate
from fastsgd.loop.state import LoopState
from fastsgd.strategies import STRATEGIES, Capabilities, capabilities_of

# the reviewer's run: 6 ms a step, 100 Mbit/s and 20 ms between workers
SLOW_LINKS = {"data.name": "digits", "model.name": "mlp", "run.steps": 60,
              "compute.model": "fixed", "compute.step_time": "6ms",
              "network.bandwidth": "100Mbit", "network.latency": "20ms", "run.workers": 4}
BATCH = 32  # data.batch_size's default
ONE_WORKER = BATCH / 0.006  # samples a second of one worker alone: 5,333


def _simulate(tmp_path, options):
    return fs.Job(options={**options, "run.out": str(tmp_path / "run")}, quiet=True).simulate()


def _true_rate(summary):
    return summary["steps"] * summary["global_batch"] / summary["simulated_time"]


@pytest.mark.parametrize("strategy, options", [
    ("diloco", {"strategy.period": 60}),  # showed 21,333 samples/s (100% efficiency): 14,694
    ("diloco", {"strategy.period": 30}),  # showed 14,617: 11,206
    ("allreduce", {"run.steps": 20}),
    ("localsgd", {"strategy.period": 8}),  # 60 % 8 != 0: a last average after step 60
])
def test_a_lockstep_or_periodic_run_is_rated_on_every_step(tmp_path, strategy, options):
    """The last step's synchronization is the method's: rate = steps x global batch over the
    training time, to float rounding (every worker ends together)."""
    summary = _simulate(tmp_path, {**SLOW_LINKS, "strategy.name": strategy, **options}).summary
    assert summary["samples_per_second"] == pytest.approx(_true_rate(summary), rel=1e-12)
    assert summary["samples_per_second"] < 4 * ONE_WORKER  # not 100% scaling efficiency


def _clocks(run):
    """Each worker's clock after its second-to-last step and after its last (metrics.jsonl,
    a line a step)."""
    steps, clocks = run.summary["steps"], defaultdict(dict)
    for row in run.metrics():
        clocks[row["rank"]][row["step"]] = row["time"]
    return [(c[steps - 1], c[steps]) for _, c in sorted(clocks.items())]


@pytest.mark.parametrize("strategy", ["ps", "ssp"])
def test_an_asynchronous_drain_is_not_charged_to_the_fast_workers(tmp_path, strategy):
    """Worker 3 is 3x slow: on the last step the others wait for it (ssp: for its last two
    steps at most). Each worker's rate is every step over its clock at the end less how
    far ahead of the slowest its second-to-last step ended."""
    run = _simulate(tmp_path, {**SLOW_LINKS, "network.bandwidth": "10Gbit",
                               "network.latency": "1ms", "run.steps": 20,
                               "compute.slowdown": [1, 1, 1, 3], "run.log_every": 1,
                               "strategy.name": strategy})
    steps, clocks = run.summary["steps"], _clocks(run)
    slowest = max(penultimate for penultimate, _ in clocks)
    own = sum(steps * BATCH / (end - (slowest - penultimate)) for penultimate, end in clocks)
    assert run.summary["samples_per_second"] == pytest.approx(own, rel=1e-12)
    assert run.summary["samples_per_second"] > _true_rate(run.summary)  # the wait left out


@pytest.mark.parametrize("strategy", ["ps", "adpsgd", "sgp"])
def test_an_asynchronous_drain_of_its_own_queued_messages_is_charged(tmp_path, strategy):
    """No straggler, a slow network: the end waits for the messages still queued, no worker
    for another; leaving the last step out showed ps at 21,333 samples/s (15x its 1,462)."""
    summary = _simulate(tmp_path, {**SLOW_LINKS, "strategy.name": strategy}).summary
    assert summary["samples_per_second"] < 1.1 * _true_rate(summary)


def test_a_strategy_with_no_drain_counts_each_workers_last_step(tmp_path):
    """hogwild waits for no one, at the end neither: each worker's every step over its own
    clock after its last (the straggler ends last; the others' rates are their own)."""
    run = _simulate(tmp_path, {**SLOW_LINKS, "run.steps": 10, "compute.slowdown": [1, 3],
                               "run.workers": 2, "run.log_every": 1, "strategy.name": "hogwild"})
    steps = run.summary["steps"]
    own = sum(steps * BATCH / last for _, last in _clocks(run))
    assert run.summary["samples_per_second"] == pytest.approx(own, rel=1e-12)


def test_the_asynchronous_drains_are_those_of_the_asynchronous_strategies():
    drains = {name for name in STRATEGIES if capabilities_of(STRATEGIES.get(name)).async_drain}
    assert drains == {"ssp", "ps", "sgp", "adpsgd", "async_diloco"}
    # an instance with options of its own keeps the flag's default: streaming diloco
    assert not capabilities_of(STRATEGIES.get("diloco")(fragments=2)).async_drain


class _Strategy:
    def __init__(self, async_drain: bool):
        self.capabilities = Capabilities(async_drain=async_drain)


def _ctx(async_drain: bool, steps: int = 10, **state) -> SimpleNamespace:
    return SimpleNamespace(state=LoopState(**state), steps=steps, accumulate=2,
                           replica=SimpleNamespace(strategy=_Strategy(async_drain)),
                           plan=SimpleNamespace(config={"data": {"batch_size": 8}}))


@pytest.mark.parametrize("ctx, lead, rate", [
    (_ctx(False, penultimate=4.0), 0.0, 10 * 16 / 5.0),  # every step, to the end
    (_ctx(True, penultimate=4.0), 1.0, 10 * 16 / 4.0),  # less its wait for the slowest
    (_ctx(True, steps=1, penultimate=None), 0.0, 1 * 16 / 5.0),  # one step: it is the last
    # its strategy ended it after step 6 (Context.end): the steps it trained, to there
    (_ctx(False, idle=4, ended=True, penultimate=3.0), 0.0, 6 * 16 / 3.0),
    (_ctx(True, idle=4, ended=True, penultimate=3.0), 0.0, 6 * 16 / 3.0),
])
def test_the_rate_of_one_worker(ctx, lead, rate):
    assert _rate(ctx, 5.0, lead) == rate


def test_no_time_no_rate():
    assert _rate(_ctx(False), 0.0) != _rate(_ctx(False), 0.0)  # NaN: null in summary.json
