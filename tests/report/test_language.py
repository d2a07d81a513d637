"""The report of language models: the tokens each trained on (steps x global batch x
model.context), a line where runs of different tokens or contexts sit side by side, and
epochs to target that read where a corpus takes thousands of steps to pass once."""

import csv
import io

import pytest

import fastsgd as fs
from fastsgd.report import load_run, text_report, write_report
from fastsgd.report.table import markdown_columns, rows, to_markdown
from fastsgd.report.text import epochs

GPT = {"model.name": "gpt", "data.name": "text", "model.layers": 1, "model.width": 32,
       "model.heads": 2, "data.batch_size": 4, "run.steps": 10, "run.eval_every": 5,
       "run.target_loss": 5.0, "compute.model": "fixed", "compute.step_time": "2ms"}
RUNS = {  # name: workers, run.accumulate, model.context
    "w2": (2, 1, 16), "w2-acc2": (2, 2, 16), "w4": (4, 1, 16), "w2-ctx32": (2, 1, 32)}
TOKENS_NOTE = "these language models trained on different numbers of tokens"
CONTEXT_NOTE = "these language models have different contexts (model.context)"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Four runs of a tiny GPT on a corpus of 400 kB: 2 workers, 2 with 2 micro-batches a
    step (the tokens of 4 workers), 4 workers, and 2 with twice the context; and a run on
    images."""
    root = tmp_path_factory.mktemp("language")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n"
                              for i in range(12000)))
    for name, (workers, accumulate, context) in RUNS.items():
        fs.Job(options={**GPT, "data.path": str(corpus), "run.workers": workers,
                        "run.accumulate": accumulate, "model.context": context,
                        "run.out": str(root / name)}, quiet=True).simulate()
    fs.Job(options={"data.name": "digits", "model.name": "mlp", "run.steps": 20,
                    "run.eval_every": 10, "run.workers": 2, "compute.model": "fixed",
                    "compute.step_time": "2ms", "run.out": str(root / "images")},
           quiet=True).simulate()
    return {name: load_run(root / name) for name in [*RUNS, "images"]}


def test_each_language_model_row_has_the_tokens_it_trained_on(runs):
    table = {r["run"]: r for r in rows(list(runs.values()))}
    for name, (workers, accumulate, context) in RUNS.items():
        summary = runs[name].summary
        assert summary["global_batch"] == workers * 4 * accumulate
        assert table[name]["tokens"] == 10 * workers * 4 * accumulate * context, name
        assert table[name]["context"] == context
    assert table["w2-acc2"]["tokens"] == table["w4"]["tokens"] == 2560
    assert table["images"]["tokens"] is None and table["images"]["context"] is None
    header = to_markdown([table["w2"], table["images"]]).splitlines()[0]
    assert "| workers | tokens |" in header and "| 1.28k |" in to_markdown([table["w2"]])
    assert "tokens" not in [h for h, _ in markdown_columns([table["images"]])]


def _notes(markdown):
    return [line for line in markdown.splitlines() if line.startswith("Note: ")]


def test_runs_of_different_tokens_or_contexts_are_said_to_be_so_in_one_line_each(runs):
    def table(*names):
        return rows([runs[n] for n in names])
    assert _notes(to_markdown(table("w2-acc2", "w4", "images"))) == []  # equal tokens
    notes = _notes(to_markdown(table("w2", "w4", "w2-acc2")))
    assert len(notes) == 1 and TOKENS_NOTE in notes[0]
    assert "1 run 1.28k tokens, 2 runs 2.56k tokens" in notes[0]
    notes = _notes(to_markdown(table("w2", "w2-ctx32")))
    assert len(notes) == 2 and TOKENS_NOTE in notes[0] and CONTEXT_NOTE in notes[1]
    assert "1 run 16 tokens, 1 run 32 tokens" in notes[1]
    notes = _notes(to_markdown(table("w4", "w2-ctx32")))  # as many tokens, longer windows
    assert len(notes) == 1 and CONTEXT_NOTE in notes[0]


def test_the_written_report_has_the_tokens_and_the_notes(runs, tmp_path):
    write_report(list(runs.values()), tmp_path / "out")
    table = list(csv.DictReader(io.StringIO((tmp_path / "out" / "report.csv").read_text())))
    assert {r["run"]: r["tokens"] for r in table} == {
        "w2": "1280", "w2-acc2": "2560", "w4": "2560", "w2-ctx32": "2560", "images": ""}
    for page in ("report.md", "report.html"):
        text = (tmp_path / "out" / page).read_text()
        assert text.count(TOKENS_NOTE) == 1 and text.count(CONTEXT_NOTE) == 1, page


def test_epochs_to_target_read_where_they_are_small(runs):
    assert [epochs(v) for v in (0.0004123, 0.05, 0.1, 0.91, 2.0, 0.0)] == [
        "0.00041", "0.05", "0.10", "0.91", "2.00", "0.00"]
    row = rows([runs["w2"]])[0]
    assert 0 < row["epochs_to_target"] < 0.005  # 400 kB: a step is 0.05% of an epoch
    cells = to_markdown([row]).splitlines()[2].split(" | ")
    at = to_markdown([row]).splitlines()[0].split(" | ").index("epochs to target")
    assert cells[at] == f"{row['epochs_to_target']:.2g}" != "0.00"
    first = text_report(runs["w4"].path).splitlines()[0]
    assert "0.00 epochs" not in first and "2.56k tokens, global batch 16" in first
