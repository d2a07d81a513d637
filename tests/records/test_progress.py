"""The progress bar: the evaluation it shows is the latest (the final one on its last line)
and what the run is scored by (a language model's validation loss, not its accuracy)."""

from types import SimpleNamespace

import pytest

from fastsgd.loop.observe import EvalLog, Target
from fastsgd.records.progress import Progress, shown_metric


def _log(kind="images", metric="accuracy", last=None):
    return SimpleNamespace(kind=kind, target=SimpleNamespace(metric=metric), last=last)


def _lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line]


def test_the_last_line_shows_the_final_evaluation(capsys):
    """At 100/100 the bar showed step 80's 32.80% where the final evaluation read 33.18%: in
    the simulator step 100's evaluation is recorded after worker 0 went on, and the final
    one comes after the last step; the last line waits for close."""
    log = _log(last=(80, 0.3280, 2.1, 0.0))
    bar = Progress(100)
    bar.follow(log)
    for done in range(1, 101):
        bar.update(done, 2.0)
    log.last = (100, 0.3318, 2.0, 0.0)  # recorded once every worker handed step 100 in
    bar.close()
    lines = _lines(capsys)
    assert [line.split()[1] for line in lines][-2:] == ["90/100", "100/100"]  # one last line
    assert lines[-1].endswith("loss 2.0000 acc 33.18%")
    assert lines[-2].endswith("acc 32.80%")


@pytest.mark.parametrize("kind, metric", [("text", "accuracy"), ("tokens", "accuracy"),
                                          ("regression", "accuracy"), ("images", "loss")])
def test_a_run_scored_by_its_loss_shows_the_validation_loss(capsys, kind, metric):
    """Language models (text, tokens), a regression, a run with run.target_loss."""
    bar = Progress(10)
    bar.follow(_log(kind, metric, last=(10, 0.41, 3.21, 0.0)))
    bar.update(10, 3.5)
    bar.close()
    lines = _lines(capsys)
    assert len(lines) == 1 and lines[0].endswith("10/10 00:00<00:00 loss 3.5000 val loss 3.2100")


def test_a_classifier_shows_its_accuracy_from_the_real_log(tmp_path, capsys):
    log = EvalLog(tmp_path / "eval.jsonl", Target("accuracy", 0.9), "images")
    bar = Progress(10)
    bar.follow(log)
    assert bar.metric == "accuracy"
    bar.update(5, 1.25)  # nothing evaluated yet: the training loss alone
    log.last = (10, 0.5, 1.0, 0.0)
    bar.update(10, 1.0)
    bar.close()
    assert [line.split(" ", 3)[-1] for line in _lines(capsys)] == [
        "loss 1.2500", "loss 1.0000 acc 50.00%"]


def test_the_metric_shown():
    assert shown_metric("images") == "accuracy"
    assert shown_metric("images", "loss") == shown_metric("text") == "loss"
    assert shown_metric("tokens") == shown_metric("regression") == "loss"


def test_a_bar_that_follows_no_log_shows_the_accuracy_it_is_given(capsys):
    bar = Progress(10)
    bar.update(10, 0.5, 0.25)
    assert _lines(capsys) == []  # held for close
    bar.close()
    assert _lines(capsys)[-1].endswith("loss 0.5000 acc 25.00%")
    bar.update(10, 0.5, float("nan"))  # a regression's accuracy: none
    bar.close()
    assert _lines(capsys)[-1].endswith("loss 0.5000")


def test_a_run_stopped_before_its_last_step_ends_its_line_only(capsys):
    bar = Progress(10)
    bar.tty = True  # on a terminal: one line, redrawn
    bar.update(4, 0.5, 0.25)
    bar.close()
    assert capsys.readouterr().err.endswith("4/10 00:00<00:00 loss 0.5000 acc 25.00%\n")


def test_a_disabled_bar_writes_nothing(capsys):
    bar = Progress(10, enabled=False)
    bar.follow(_log(last=(10, 0.5, 1.0, 0.0)))
    bar.update(10, 1.0)
    bar.close()
    assert capsys.readouterr().err == ""
