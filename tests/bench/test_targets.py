"""`fastsgd bench` with a loss target: each cell's time to it, scored over seeds as MLPerf
does, in the bench's report."""

import csv
import io
import json

import pytest

from fastsgd.bench import cells, load_spec
from fastsgd.cli.main import main
from fastsgd.report.table import mlperf_score

SPEC = """
[bench]
mode = "simulate"

[base]
data.name = "digits"
model.name = "mlp"
run.steps = 30
run.eval_every = 10
run.workers = 2
run.target_loss = 1.0
compute.model = "fixed"
compute.step_time = "2ms"

[axes]
"run.seed" = [1, 2, 3]
"""


def test_a_loss_target_is_part_of_each_cell(tmp_path):
    path = tmp_path / "loss.toml"
    path.write_text(SPEC)
    matrix = cells(*load_spec(path))
    assert [c.config["run"]["target_loss"] for c in matrix] == [1.0] * 3
    other = tmp_path / "other.toml"
    other.write_text(SPEC.replace("run.target_loss = 1.0", "run.target_loss = 2.0"))
    assert not {c.id for c in matrix} & {c.id for c in cells(*load_spec(other))}


@pytest.mark.multiproc
def test_a_bench_with_a_loss_target_scores_the_time_to_it(tmp_path, capsys):
    spec, out = tmp_path / "loss.toml", tmp_path / "b"
    spec.write_text(SPEC)
    assert main(["bench", str(spec), "--out", str(out), "--jobs", "3", "--quiet"]) == 0
    labels = json.loads((out / "cells" / "labels.json").read_text())
    summaries = [json.loads((out / "cells" / i / "summary.json").read_text()) for i in labels]
    assert all(s["target"] == {"metric": "loss", "value": 1.0} for s in summaries)
    times = [s["time_to_target"] for s in summaries]
    assert None not in times  # digits' loss is under 0.6 by step 20
    seeds = list(csv.DictReader(io.StringIO((out / "report" / "seeds.csv").read_text())))
    assert len(seeds) == 1 and seeds[0]["target_metric"] == "loss"
    assert float(seeds[0]["time_to_target_s"]) == pytest.approx(mlperf_score(times))
    markdown = (out / "report" / "report.md").read_text()
    assert "time to loss 1.00 (MLPerf)" in markdown and "| time to loss 1.00 |" in markdown
