"""Workers that crash in the simulator ([faults]): the survivors carry on (gossip, push-sum,
a parameter server) or shrink (allreduce, localsgd, easgd, bmuf, diloco), deterministically, and the
summary lists the lost workers (docs/simulator.md, "Faults")."""

import json

import pytest
import torch

import fastsgd as fs
from fastsgd.errors import ConfigError
from fastsgd.workloads.data import load_dataset

FILES = ("model.pt", "metrics.jsonl", "eval.jsonl")
CASES = {  # name: strategy options
    "allreduce": {"strategy.name": "allreduce"},
    "dpsgd-ring": {"strategy.name": "dpsgd", "strategy.topology": "ring"},
    "dpsgd-torus": {"strategy.name": "dpsgd", "strategy.topology": "torus"},
    "sgp": {"strategy.name": "sgp"},
    "adpsgd": {"strategy.name": "adpsgd"},
    "ps": {"strategy.name": "ps"},
    "ltfb": {"strategy.name": "ltfb", "strategy.period": 10},
    "localsgd": {"strategy.name": "localsgd"},
    "easgd": {"strategy.name": "easgd"},
    "bmuf": {"strategy.name": "bmuf"},
    "diloco": {"strategy.name": "diloco", "strategy.period": 10},
}
CRASHES = [{"worker": 3, "step": 40}, {"worker": 6, "at": "200ms"}]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _simulate(digits, out, **options):
    options = {"run.steps": 120, "run.eval_every": 30, "data.batch_size": 16,
               "compute.model": "fixed", "compute.step_time": "3ms",
               "faults.crash": CRASHES,
               "faults.detect": "50ms", "run.out": str(out), **options}
    return fs.Job(model="mlp", data=digits, options=options, quiet=True).simulate(8)


@pytest.mark.parametrize("case", list(CASES))
def test_survivors_carry_on_and_repeat_bitwise(case, digits, tmp_path):
    first = _simulate(digits, tmp_path / "a", **CASES[case])
    lost = first.summary["lost_workers"]
    assert [w["worker"] for w in lost] == [3, 6]
    assert lost[0]["step"] == 40 and 40 < lost[1]["step"] < 120, lost
    assert first.summary["final_accuracy"] > 0.85, first.summary["final_accuracy"]
    evals = [json.loads(line)["step"] for line in (first.run_dir / "eval.jsonl").open()]
    assert evals == [30, 60, 90, 120]  # steps after a loss are evaluated without the lost
    ranks_after = {json.loads(line)["rank"] for line in (first.run_dir / "metrics.jsonl").open()
                   if json.loads(line)["step"] > 110}
    assert ranks_after == {0, 1, 2, 4, 5, 7}
    for worker in lost:  # a crashed worker's lines are kept up to its crash (not buffered away)
        steps = [row["step"] for row in first.metrics() if row["rank"] == worker["worker"]]
        assert steps == list(range(1, worker["step"] + 1)), (worker, steps[-3:])
    second = _simulate(digits, tmp_path / "b", **CASES[case])
    for name in FILES:
        assert (first.run_dir / name).read_bytes() == (second.run_dir / name).read_bytes(), name


def test_allreduce_survivors_wait_for_the_detection_then_agree(digits, tmp_path):
    """The step after the crash waits `detect` for the lost worker, no longer; the shrunk
    group averages over the survivors, so the replicas stay identical."""
    result = _simulate(digits, tmp_path, **{"strategy.name": "allreduce",
                                            "faults.crash": [{"worker": 3, "step": 40}],
                                            "faults.detect": "2s"})
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    waits = {r["step"]: r["aggregation"] for r in rows if r["rank"] == 0}
    assert 1.99 < waits[42] < 2.01  # step index 41: the first all-reduce without worker 3,
    # which crashed a forward and backward before it (3 ms) and is known lost 2 s after
    assert max(w for s, w in waits.items() if s != 42) < 0.01
    assert result.summary["consensus_distance"] == 0


def test_a_gossip_ring_waits_only_where_the_gap_is(digits, tmp_path):
    """dpsgd on a ring: the lost worker's neighbours wait `detect` and close the ring;
    workers further away go on until they need their neighbours' next step."""
    result = _simulate(digits, tmp_path, **{"strategy.name": "dpsgd",
                                            "faults.crash": [{"worker": 3, "step": 40}],
                                            "faults.detect": "2s"})
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    first_wait = {r["rank"]: r["step"] for r in sorted(rows, key=lambda r: r["step"])[::-1]
                  if r["aggregation"] > 1.9}
    assert first_wait[2] == first_wait[4] == 41  # the gap's neighbours, at once
    assert first_wait[1] == first_wait[5] == 42  # one step later, one hop further
    assert result.summary["final_accuracy"] > 0.85


@pytest.mark.parametrize("strategy", ["allreduce", "sgp"])
def test_worker_0_can_crash_and_the_lowest_survivor_writes_the_results(strategy, digits,
                                                                        tmp_path):
    result = _simulate(digits, tmp_path, **{"strategy.name": strategy,
                                            "faults.crash": [{"worker": 0, "step": 40}]})
    assert [lost["worker"] for lost in result.summary["lost_workers"]] == [0]
    assert result.summary["final_accuracy"] > 0.85
    assert (result.run_dir / "model.pt").exists()


@pytest.mark.parametrize("crash, message", [
    ([{"worker": 9, "step": 1}], "faults.crash[0].worker must be a worker rank in 0..7"),
    ([{"worker": 2}], "faults.crash[0] needs exactly one of at (a time) or step"),
    ([{"worker": 2, "at": "1s", "step": 3}], "needs exactly one of"),
    ([{"worker": 2, "at": "soon"}], "faults.crash[0].at"),
    ([{"worker": 2, "step": -1}], "faults.crash[0].step must be a step count >= 0"),
    ([{"worker": 2, "when": "1s"}], "faults.crash[0] must be a table like"),
    ([{"worker": 2, "step": 1}, {"worker": 2, "step": 5}], "worker 2 crashes twice"),
    ([{"worker": r, "step": 1} for r in range(8)], "all 8 workers crash"),
    ([{"worker": 2, "step": 120}], "faults.crash: worker 2 at step 120 is past the run's "
                                   "last step (119): it would never crash"),
])
def test_bad_faults_are_one_line(crash, message, digits, tmp_path):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        _simulate(digits, tmp_path / "run", **{"faults.crash": crash})
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("options, message", [
    ({"strategy.name": "ssp"}, "strategy.name = 'ssp' does not carry on"),
    ({"strategy.name": "diloco", "strategy.overlap": 2},
     "strategy.name = 'diloco' does not carry on"),
    ({"strategy.name": "allreduce", "compression.name": "topk"},
     "with compression.name = 'topk' does not carry on"),
    ({"strategy.name": "ps", "strategy.servers": 4}, "worker 3 holds a parameter server shard"),
    ({"run.checkpoint_every": 10}, "cannot be checkpointed yet"),
])
def test_what_cannot_carry_on_yet_refuses(options, message, digits, tmp_path):
    with pytest.raises(ConfigError, match=message):
        _simulate(digits, tmp_path / "run", **options)


def test_a_link_down_holds_up_a_collective_not_a_gossip_of_others(digits, tmp_path):
    """Worker 3's link is down for a second: allreduce waits for it (once), sgp's other
    workers keep stepping; nothing is lost."""
    down = {"faults.crash": [], "faults.down": [{"worker": 3, "from": "100ms", "to": "1.1s"}]}
    sync = _simulate(digits, tmp_path / "sync", **{"strategy.name": "allreduce", **down})
    rows = [json.loads(line) for line in (sync.run_dir / "metrics.jsonl").open()]
    waits = sorted(r["aggregation"] for r in rows if r["rank"] == 0)
    assert 0.99 < waits[-1] < 1.0 and waits[-2] < 0.01
    assert sync.summary["lost_workers"] == []
    # unbounded (max_lag = 0): with the default bound they would wait after 16 steps
    gossip = _simulate(digits, tmp_path / "gossip", **{"strategy.name": "sgp",
                                                       "strategy.max_lag": 0, **down})
    rows = [json.loads(line) for line in (gossip.run_dir / "metrics.jsonl").open()]
    during = [r for r in rows if r["rank"] == 0 and 0.2 < r["time"] < 1.0]
    assert len(during) > 50  # worker 0 trains on while worker 3 is cut off
    assert gossip.summary["final_accuracy"] > 0.85


@pytest.mark.parametrize("down, message", [
    ([{"worker": 3, "from": "2s", "to": "1s"}], r"faults.down\[0\]: to \(1s\) must come after"),
    ([{"worker": 3, "from": "2s"}], r"faults.down\[0\] must be a table like"),
    ([{"worker": 8, "from": "1s", "to": "2s"}], r"faults.down\[0\].worker must be a worker"),
])
def test_bad_outages_are_one_line(down, message, digits, tmp_path):
    with pytest.raises(ConfigError, match=message):
        _simulate(digits, tmp_path / "run", **{"faults.crash": [], "faults.down": down})


def test_a_collective_without_a_lost_worker_sums_every_survivor():
    """Worker 1 crashes at step 1: from then on each all-reduce is the sum of the three
    survivors' tensors (ranks after the lost one's turn included), over 3 members."""
    from fastsgd.transport.sim import Faults, simulate

    def fn(t):
        seen = []
        for step in range(3):
            t.compute("update", step)  # where a crash takes effect
            x = torch.full((4,), float(t.rank + 1))
            t.all_reduce(x)
            seen.append((x.tolist(), len(t.members())))
        return seen

    faults = Faults.parse({"crash": [{"worker": 1, "step": 1}], "detect": "10ms"}, 4)
    results = simulate(4, fn, faults=faults)
    assert results[1] is None
    for rank in (0, 2, 3):
        assert results[rank] == [([10.0] * 4, 4), ([8.0] * 4, 3), ([8.0] * 4, 3)]


def test_a_crash_timed_past_the_end_is_named_with_the_clock_it_counts_on(digits, tmp_path,
                                                                          capfd):
    result = _simulate(digits, tmp_path / "run", **{"faults.crash": [
        {"worker": 6, "at": "200ms"}, {"worker": 2, "at": "3600s"}]})
    assert [lost["worker"] for lost in result.summary["lost_workers"]] == [6]
    said = [line for line in capfd.readouterr().err.splitlines() if "did not crash" in line]
    assert len(said) == 1 and said[0].startswith(
        "fastsgd: faults.crash: worker 2 at 3600s did not crash: the run ended first, at ")
    assert said[0].endswith(" on the simulation's clock, which counts from its start, setup "
                            "included (metrics' time counts from the start of training)")
