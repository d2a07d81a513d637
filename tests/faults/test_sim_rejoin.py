"""Lost workers replaced by new processes in the simulator (run.rejoin): the new one joins
from a live worker's state at a step set ahead of every worker, trains to the end, and the
run repeats bit for bit (docs/simulator.md, "Faults"; real processes: test_real_rejoin.py)."""

import json

import pytest

import fastsgd as fs
from fastsgd.errors import ConfigError
from fastsgd.workloads.data import load_dataset

FILES = ("model.pt", "metrics.jsonl", "eval.jsonl")
CASES = {  # name: strategy options
    "dpsgd-ring": {"strategy.name": "dpsgd", "strategy.topology": "ring"},
    "sgp": {"strategy.name": "sgp"},
    "adpsgd": {"strategy.name": "adpsgd"},
    "ps": {"strategy.name": "ps"},
    "ltfb": {"strategy.name": "ltfb", "strategy.period": 10},
    # lossy codecs: an edge to a new process starts both ends' copies from a model sent
    # exact (gossip.opens_late)
    "sgp-topk": {"strategy.name": "sgp", "compression.name": "topk",
                 "compression.ratio": 0.1},
    "adpsgd-qsgd": {"strategy.name": "adpsgd", "compression.name": "qsgd"},
}
CRASHES = [{"worker": 3, "step": 40}, {"worker": 6, "at": "200ms"}]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _simulate(digits, out, workers=8, **options):
    options = {"run.steps": 120, "run.eval_every": 30, "data.batch_size": 16,
               "compute.model": "fixed", "compute.step_time": "3ms", "run.rejoin": True,
               "faults.crash": CRASHES, "faults.detect": "50ms", "faults.restart": "30ms",
               "run.out": str(out), **options}
    return fs.Job(model="mlp", data=digits, options=options, quiet=True).simulate(workers)


def _rows(result) -> list[dict]:
    return [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]


@pytest.mark.parametrize("case", list(CASES))
def test_new_workers_join_from_a_live_state_and_repeat_bitwise(case, digits, tmp_path):
    first = _simulate(digits, tmp_path / "a", **CASES[case])
    summary = first.summary
    assert summary["lost_workers"] == []  # both are back
    rejoined = summary["rejoined_workers"]
    assert [w["worker"] for w in rejoined] == [3, 6], rejoined
    assert rejoined[0]["left_at_step"] == 40
    for w in rejoined:  # set ahead of every worker, before the end
        assert w["left_at_step"] + 4 <= w["joined_at_step"] < 120, rejoined
    rows = _rows(first)
    for w in rejoined:  # the new process logs every step from its join on, from a live model
        mine = [r for r in rows if r["rank"] == w["worker"] and r["step"] > w["left_at_step"]]
        assert [r["step"] for r in mine] == list(range(w["joined_at_step"] + 1, 121))
        assert mine[0]["loss"] < 1.0, mine[0]  # a fresh MLP's is 2.3
    assert {r["rank"] for r in rows if r["step"] > 110} == set(range(8))
    evals = [json.loads(line)["step"] for line in (first.run_dir / "eval.jsonl").open()]
    assert evals == [30, 60, 90, 120]
    assert summary["final_accuracy"] > 0.85, summary["final_accuracy"]
    second = _simulate(digits, tmp_path / "b", **CASES[case])
    for name in FILES:
        assert (first.run_dir / name).read_bytes() == (second.run_dir / name).read_bytes(), name
    assert second.summary["rejoined_workers"] == rejoined


def test_a_replaced_worker_may_be_lost_and_replaced_again(digits, tmp_path):
    """The n-th crash of a rank is that of the n-th process standing for it."""
    result = _simulate(digits, tmp_path, **{"strategy.name": "sgp",
                                            "faults.crash": [{"worker": 3, "step": 20},
                                                             {"worker": 3, "step": 80}]})
    rejoined = result.summary["rejoined_workers"]
    assert [w["worker"] for w in rejoined] == [3, 3], rejoined
    assert rejoined[0]["left_at_step"] == 20 and rejoined[1]["left_at_step"] == 80
    assert rejoined[0]["joined_at_step"] < 80 < rejoined[1]["joined_at_step"]
    assert result.summary["final_accuracy"] > 0.85


def test_a_new_worker_whose_donor_dies_first_is_replaced_in_turn(digits, tmp_path):
    """Worker 0, the donor, dies just before the step it was to hand its state over at: the
    new worker 3 leaves at that step, and another takes its place from worker 1's state, as
    on real processes (FASTSGD_TEST_KILL_DONOR in test_real_rejoin.py)."""
    ring = {"strategy.name": "dpsgd", "strategy.topology": "ring"}
    alone = _simulate(digits, tmp_path / "a", **ring, **{"faults.crash": [CRASHES[0]]})
    handover = alone.summary["rejoined_workers"][0]["joined_at_step"]
    crashes = [CRASHES[0], {"worker": 0, "step": handover - 1}]
    result = _simulate(digits, tmp_path / "b", **ring, **{"faults.crash": crashes})
    rejoined = result.summary["rejoined_workers"]
    assert [(w["worker"], w["left_at_step"]) for w in rejoined] == [
        (0, handover - 1), (3, 40), (3, handover)], rejoined
    rows = _rows(result)
    for rank in (0, 3):  # both back, from worker 1's state
        assert max(r["step"] for r in rows if r["rank"] == rank) == 120
    assert result.summary["final_accuracy"] > 0.85


@pytest.mark.parametrize("options, culprit", [
    ({"strategy.name": "allreduce"}, "run.rejoin"),
    ({"strategy.name": "dpsgd", "compression.name": "topk"}, "run.rejoin"),
    ({"strategy.name": "sgp", "run.rejoin": False,
      "faults.crash": [{"worker": 3, "step": 20}, {"worker": 3, "step": 80}]},
     "faults.crash[1]"),
    ({"strategy.name": "sgp", "faults.restart": "-1s"}, "faults.restart"),
])
def test_what_cannot_rejoin_is_one_line_naming_the_key(options, culprit, digits, tmp_path):
    with pytest.raises(ConfigError, match=culprit.replace("[", r"\[")):
        _simulate(digits, tmp_path, **options)


def test_every_neighbour_lost_at_once_and_new_ones_late(digits, tmp_path):
    """dpsgd on the 4x4 torus: worker 5's four neighbours crash at the same instant (a
    worker then waits on one of them when it learns of all four), and their new processes
    start long after the others reached the step they join at (the others wait for them)."""
    crashes = [{"worker": r, "step": 40} for r in (1, 4, 6, 9)]
    result = _simulate(digits, tmp_path, 16, **{"strategy.name": "dpsgd", "faults.crash": crashes,
                                                "strategy.topology": "torus",
                                                "faults.restart": "1s"})
    rejoined = result.summary["rejoined_workers"]
    assert [w["worker"] for w in rejoined] == [1, 4, 6, 9]
    assert len({w["joined_at_step"] for w in rejoined}) == 1  # one step for all four
    assert result.summary["final_accuracy"] > 0.85
