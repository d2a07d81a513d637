"""The report of runs with a loss target (time to loss X, final loss, perplexity, bits per
byte), and of summaries written before loss targets, which still read as accuracy ones."""

import csv
import io
import json

import pytest

import fastsgd as fs
from fastsgd.report import find_runs, load_run, text_report, write_report
from fastsgd.report.table import mlperf_score, over_seeds, rows, to_markdown

COMMON = {"data.name": "digits", "model.name": "mlp", "run.steps": 30, "run.eval_every": 10,
          "run.workers": 2, "compute.model": "fixed", "compute.step_time": "2ms"}
NEW_KEYS = ("target", "target_loss", "final_perplexity", "final_bits_per_byte", "data_kind")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three seeds with a loss target of 1.0 (reached: digits' loss is under 0.6 by step
    20), one run with an accuracy target."""
    root = tmp_path_factory.mktemp("targets")
    for seed in (1, 2, 3):
        fs.Job(options={**COMMON, "run.seed": seed, "run.target_loss": 1.0,
                        "run.out": str(root / f"loss-{seed}")}, quiet=True).simulate()
    fs.Job(options={**COMMON, "run.target_accuracy": 0.5, "run.out": str(root / "acc")},
           quiet=True).simulate()
    return root


def _old(run_dir, tmp_path):
    """A copy of a run directory as a run before loss targets wrote it."""
    old = tmp_path / "old"
    old.mkdir()
    for name in ("metrics.jsonl", "config.toml"):
        (old / name).write_bytes((run_dir / name).read_bytes())
    summary = json.loads((run_dir / "summary.json").read_text())
    (old / "summary.json").write_text(json.dumps(
        {k: v for k, v in summary.items() if k not in NEW_KEYS}))
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    (old / "eval.jsonl").write_text("".join(
        json.dumps({k: v for k, v in e.items() if k != "perplexity"}) + "\n" for e in evals))
    return old


def test_a_loss_target_is_timed_and_shown_as_one(runs):
    table = rows(find_runs([runs / "loss-1"]))
    row = table[0]
    run = load_run(runs / "loss-1")
    first = next(e for e in run.evals if e["loss"] <= 1.0)
    assert row["time_to_target_s"] == first["time"] == run.summary["time_to_target"]
    assert row["epochs_to_target"] == pytest.approx(
        first["step"] * run.summary["epochs"] / run.summary["steps"])
    assert (row["target_metric"], row["target_value"], row["target_accuracy"]) == (
        "loss", 1.0, None)
    assert row["final_perplexity"] == pytest.approx(2.718281828 ** row["final_loss"])
    markdown = to_markdown(table)
    assert "| time to loss 1.00 |" in markdown and "| loss | perplexity |" in markdown
    assert "bits/byte" not in markdown  # digits are not bytes of text
    assert "time to loss 1.00: " in text_report(runs / "loss-1")


def test_runs_of_two_targets_name_each_in_its_cell(runs):
    markdown = to_markdown(rows(find_runs([runs / "loss-1", runs / "acc"])))
    assert "| time to target |" in markdown
    assert "| loss 1.00: " in markdown and "| 50%: " in markdown


def test_seeds_with_a_loss_target_are_scored_as_mlperf_does(runs):
    seeds = over_seeds(find_runs([runs / f"loss-{s}" for s in (1, 2, 3)]))
    assert len(seeds) == 1 and seeds[0]["target_metric"] == "loss" and seeds[0]["target"] == 1.0
    times = [load_run(runs / f"loss-{s}").summary["time_to_target"] for s in (1, 2, 3)]
    assert seeds[0]["time_to_target_s"] == mlperf_score(times) is not None
    assert seeds[0]["loss_mean"] is not None


def test_the_written_report_has_the_loss_columns_and_plot(runs, tmp_path):
    written = write_report(find_runs([runs]), tmp_path / "out")
    names = {p.name for p in written}
    assert {"loss_time.png", "loss_bytes.png", "seeds.csv", "report.md", "report.html"} <= names
    table = list(csv.DictReader(io.StringIO((tmp_path / "out" / "report.csv").read_text())))
    by_run = {r["run"]: r for r in table}
    assert by_run["loss-2"]["target_metric"] == "loss" and by_run["loss-2"]["final_loss"]
    assert by_run["acc"]["target_accuracy"] == "0.5" and by_run["acc"]["target_loss"] == ""
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "time to loss 1.00 (MLPerf)" in markdown
    assert "Validation loss against time" in (tmp_path / "out" / "report.html").read_text()


def test_a_report_of_images_alone_draws_no_loss_plot(runs, tmp_path):
    written = write_report(find_runs([runs / "acc"]), tmp_path / "out")
    assert not {"loss_time.png", "loss_bytes.png"} & {p.name for p in written}
    assert "loss" not in (tmp_path / "out" / "report.html").read_text().split("<h2>")[0]


def test_an_older_summary_still_reads_with_its_accuracy_target(runs, tmp_path):
    old = _old(runs / "acc", tmp_path)
    run = load_run(old)
    assert run.target == ("accuracy", 0.5)
    row = rows([run])[0]
    assert (row["target_metric"], row["target_accuracy"], row["bits_per_byte"]) == (
        "accuracy", 0.5, None)
    assert row["epochs_to_target"] is not None
    assert row["final_perplexity"] == pytest.approx(2.718281828 ** row["final_loss"])
    assert "| time to 50% |" in to_markdown([row])
    assert "time to 50%: " in text_report(old) and "perplexity" not in text_report(old)
    assert "report.html" in {p.name for p in write_report([run], tmp_path / "out")}


def test_seeds_are_scored_as_the_report_and_the_docs_say(runs, tmp_path):
    """MLPerf drops the fastest and the slowest, a run that did not reach the target
    counting as the slowest, and more than one such run voids the result; with 2 seeds
    nothing can be dropped, so one that did not reach it makes the cell "not reached". The
    seeds' table says so above it, and docs/benchmarks.md says the same."""
    from pathlib import Path

    from fastsgd.report.table import MLPERF

    assert mlperf_score([3.0, 1.0, None]) == 3.0 and mlperf_score([3.0, None, None]) is None
    assert mlperf_score([1.0, 2.0]) == 1.5 and mlperf_score([1.0, None]) is None
    write_report(find_runs([runs / f"loss-{s}" for s in (1, 2)]), tmp_path / "out")
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert f"## Over seeds\n\n{MLPERF}\n\n" in markdown
    assert MLPERF in (tmp_path / "out" / "report.html").read_text().replace("&quot;", '"')
    docs = " ".join((Path(__file__).parents[2] / "docs" / "benchmarks.md").read_text().split())
    assert "with 2 seeds, nothing is dropped" in docs and "more than one makes" not in docs
