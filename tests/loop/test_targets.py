"""Loss targets and loss metrics (issue 49, item 3): run.target_loss, where set, is the run's
target (reached at or below it); every evaluation also says its perplexity, and for
byte-level text its bits per byte; summary.json says which target the run had."""

import json
import math

import pytest

import fastsgd as fs
from fastsgd.loop.observe import EvalLog, Target, target_of
from fastsgd.loop.results import final_loss_metrics, targets
from fastsgd.records.metrics import loss_metrics
from fastsgd.records.tensorboard import EventFile
from fastsgd.report import text_report
from fastsgd.report.runs import load_run
from fastsgd.report.table import rows, to_markdown

SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 8,
         "run.eval_every": 2, "compute.model": "fixed", "compute.step_time": "1ms"}
LOSSES = [4.0, 3.0, 2.0, 1.5, 1.25, 1.0]  # the evaluations' losses, in turn


def _falling(model, dataset, device):
    """An evaluate whose loss falls by the evaluation (accuracy stays at 0.1)."""
    _falling.calls = getattr(_falling, "calls", 0) + 1
    return 0.1, LOSSES[min(_falling.calls, len(LOSSES)) - 1]


def _run(tmp_path, name, real=False, **options):
    _falling.calls = 0  # a forked worker starts from here too
    job = fs.Job(options={**SMALL, **options, "run.out": str(tmp_path / name)},
                 evaluate=_falling, quiet=True)
    return job.run() if real else job.simulate()


# --- the target ----------------------------------------------------------------------------

def test_target_loss_where_set_replaces_target_accuracy():
    assert target_of({"target_accuracy": 0.9, "target_loss": 2.0}) == Target("loss", 2.0)
    assert target_of({"target_accuracy": 0.9, "target_loss": 0.0}) == Target("accuracy", 0.9)
    assert not target_of({"target_accuracy": 0.0, "target_loss": 0.0})
    assert target_of({"target_accuracy": 0.5}) == Target("accuracy", 0.5)  # an older config


def test_a_language_model_has_no_accuracy_target_only_a_loss_target():
    run = {"target_accuracy": 0.88, "target_loss": 0.0}
    assert target_of(run, "images") == Target("accuracy", 0.88)
    assert not target_of(run, "text") and not target_of(run, "tokens")
    assert target_of({**run, "target_loss": 2.0}, "text") == Target("loss", 2.0)


def test_a_loss_target_is_reached_at_or_below_it_and_never_by_a_nan():
    loss = Target("loss", 2.0)
    assert loss.reached(0.0, 2.0) and loss.reached(0.0, 1.9) and not loss.reached(1.0, 2.1)
    assert not loss.reached(1.0, math.nan)
    accuracy = Target("accuracy", 0.5)
    assert accuracy.reached(0.5, 9.0) and not accuracy.reached(0.49, 0.0)
    assert not Target("loss", 0.0).reached(0.0, 0.0)
    with pytest.raises(ValueError):
        Target("perplexity", 3.0)


def test_the_summary_says_which_target_and_keeps_target_accuracy():
    assert targets(Target("loss", 2.0)) == {"target": {"metric": "loss", "value": 2.0},
                                            "target_accuracy": None, "target_loss": 2.0}
    assert targets(Target("accuracy", 0.88)) == {
        "target": {"metric": "accuracy", "value": 0.88}, "target_accuracy": 0.88,
        "target_loss": None}
    assert targets(Target()) == {"target": None, "target_accuracy": None, "target_loss": None}


# --- perplexity and bits per byte ----------------------------------------------------------

def test_perplexity_always_and_bits_per_byte_for_bytes_only():
    assert loss_metrics(2.0) == {"perplexity": pytest.approx(math.exp(2.0))}
    text = loss_metrics(math.log(2) * 1.5, "text")
    assert text == {"perplexity": pytest.approx(2 ** 1.5), "bits_per_byte": pytest.approx(1.5)}
    assert "bits_per_byte" not in loss_metrics(2.0, "tokens")
    assert loss_metrics(1e6)["perplexity"] == math.inf  # no OverflowError
    assert math.isnan(loss_metrics(math.nan, "text")["bits_per_byte"])
    assert final_loss_metrics(math.nan, "text") == {"final_perplexity": None,
                                                    "final_bits_per_byte": None}
    assert final_loss_metrics(0.0, "images") == {"final_perplexity": 1.0,
                                                 "final_bits_per_byte": None}


@pytest.mark.parametrize("kind, bits", [("text", True), ("images", False), ("tokens", False)])
def test_each_evaluation_record_carries_its_loss_metrics(tmp_path, kind, bits):
    log = EvalLog(tmp_path / "eval.jsonl", Target("loss", 1.5), kind)
    for step, loss in ((1, 2.0), (2, 1.5), (3, 1.0)):
        log.record(step, step / 10, None, 0.5, loss, 0.0, step / 100)
    lines = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [r["perplexity"] for r in lines] == pytest.approx([math.exp(x) for x in (2, 1.5, 1)])
    assert ("bits_per_byte" in lines[0]) is bits
    if bits:
        assert lines[0]["bits_per_byte"] == pytest.approx(2.0 / math.log(2))
    assert (log.time_to_target, log.wall_to_target) == (0.2, 0.02)
    again = EvalLog(tmp_path / "eval.jsonl", Target("loss", 1.5), kind)
    again.take_over()  # a worker that takes over finds the time to the loss target
    assert again.time_to_target == 0.2 and again.last == (3, 0.5, 1.0, 0.0)


def test_an_accuracy_given_as_a_float_is_an_accuracy_target(tmp_path):
    assert EvalLog(tmp_path / "eval.jsonl", 0.5).target == Target("accuracy", 0.5)


def test_tensorboard_logs_eval_loss_perplexity_and_bits_per_byte(tmp_path):
    log = EvalLog(tmp_path / "eval.jsonl", Target(), "text")
    log.record(1, 0.1, None, 0.5, 2.0, 0.0, 0.1)
    data = EventFile(tmp_path, 0.0).update().read_bytes()
    assert all(tag in data for tag in (b"eval_loss", b"perplexity", b"bits_per_byte"))


# --- runs ----------------------------------------------------------------------------------

def _first_reaching(result, target):
    return next((e["time"] for e in result.evals() if e["loss"] <= target), None)


def _says_time_to_loss(result, target, reached):
    s = result.summary
    assert s["target"] == {"metric": "loss", "value": target} and s["target_loss"] == target
    assert s["target_accuracy"] is None  # target_accuracy's 0.88 is not the target
    assert s["time_to_target"] == _first_reaching(result, target)
    assert (s["time_to_target"] is not None) is reached
    assert all(e["perplexity"] == pytest.approx(math.exp(e["loss"])) for e in result.evals())
    assert all("bits_per_byte" not in e for e in result.evals())  # digits: not text
    got = f"{s['time_to_target']:.1f} s" if reached else "not reached"
    assert f"time to loss {target:.2f}: {got}" in text_report(result.run_dir)
    run = load_run(result.run_dir)
    row = rows([run])[0]
    assert (row["target_metric"], row["target_loss"]) == ("loss", target)
    assert (row["epochs_to_target"] is not None) is reached
    markdown = to_markdown([row])
    assert f"time to loss {target:.2f}" in markdown and "| perplexity |" in markdown
    assert ("not reached" in markdown) is not reached


def test_a_simulated_run_reaches_its_loss_target(tmp_path):
    result = _run(tmp_path, "sim", **{"run.target_loss": 2.5})
    assert result.summary["time_to_target"] == result.evals()[2]["time"]  # loss 2.0
    _says_time_to_loss(result, 2.5, reached=True)


def test_a_simulated_run_that_never_gets_down_to_its_loss_target_says_so(tmp_path):
    result = _run(tmp_path, "never", **{"run.target_loss": 0.5})
    assert result.summary["wall_to_target"] is None
    _says_time_to_loss(result, 0.5, reached=False)


@pytest.mark.multiproc
def test_a_real_run_reaches_its_loss_target(tmp_path):
    result = _run(tmp_path, "real", real=True, **{"run.target_loss": 2.5})
    assert result.summary["wall_to_target"] is not None
    _says_time_to_loss(result, 2.5, reached=True)


@pytest.mark.multiproc
def test_a_real_run_that_never_gets_down_to_its_loss_target_says_so(tmp_path):
    _says_time_to_loss(_run(tmp_path, "real", real=True, **{"run.target_loss": 0.5}), 0.5,
                       reached=False)


def test_an_accuracy_target_on_text_is_refused_in_one_line_not_ignored(tmp_path):
    """Next-token accuracy is reported, not aimed at: a run.target_accuracy set on text
    would silently be no target, so it is refused; run.target_loss replaces it."""
    options = {"data.name": "text", "model.name": "gpt", "model.layers": 1, "model.width": 16,
               "model.heads": 2, "model.context": 16, "run.steps": 2, "run.workers": 1,
               "run.out": str(tmp_path / "a")}
    job = fs.Job(quiet=True, report=False, options={**options, "run.target_accuracy": 0.3})
    with pytest.raises(fs.UserError, match=r"^run\.target_accuracy = 0\.3: 'text' holds "
                                           r"text, whose runs aim at a validation loss: set "
                                           r"run\.target_loss instead$"):
        job.simulate()
    both = fs.Job(quiet=True, report=False, options={
        **options, "run.target_accuracy": 0.3, "run.target_loss": 9.0,
        "run.out": str(tmp_path / "b")}).simulate()
    assert both.summary["target"] == {"metric": "loss", "value": 9.0}
