"""`fastsgd bench`: a spec's matrix of cells, run as processes, resumable, reported together
with the spread over seeds scored as MLPerf does."""

import json

import pytest

from fastsgd.bench import cells, load_spec
from fastsgd.cli.main import main
from fastsgd.report.table import mlperf_score
from tests.conftest import orphans

SPEC = """
[bench]
mode = "simulate"

[base]
data.name = "digits"
model.name = "mlp"
run.steps = 30
run.eval_every = 10
run.workers = 2
compute.model = "fixed"
compute.step_time = "2ms"

[axes]
"strategy.name" = ["allreduce", "dpsgd"]
"run.seed" = [1, 2, 3]
"""


def _spec(tmp_path, text=SPEC):
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def test_the_matrix_is_the_product_of_the_axes_with_stable_ids(tmp_path):
    matrix = cells(*load_spec(_spec(tmp_path)))
    assert len(matrix) == 6 and len({c.id for c in matrix}) == 6
    assert matrix[0].label == "strategy.name=allreduce run.seed=1"
    assert matrix[4].config["strategy"]["name"] == "dpsgd" and matrix[4].config["run"]["seed"] == 2
    again = cells(*load_spec(_spec(tmp_path)))
    assert [c.id for c in again] == [c.id for c in matrix]
    moved = cells(*load_spec(_spec(tmp_path, SPEC + '"run.out" = ["elsewhere"]\n')))
    assert [c.id for c in moved] == [c.id for c in matrix]  # where it is written is no part


def test_a_section_axis_varies_keys_together(tmp_path):
    text = SPEC.replace('"strategy.name" = ["allreduce", "dpsgd"]',
                        'strategy = [{name = "dpsgd", topology = "torus"}, '
                        '{name = "sgp", topology = "onepeer"}]').replace(
                            "run.workers = 2", "run.workers = 4")
    matrix = cells(*load_spec(_spec(tmp_path, text)))
    assert [(c.config["strategy"]["name"], c.config["strategy"]["topology"]) for c in matrix] == [
        ("dpsgd", "torus")] * 3 + [("sgp", "onepeer")] * 3
    assert matrix[0].label == "strategy=dpsgd/torus run.seed=1"


def test_a_joint_axis_sets_several_sections_and_the_mode_together(tmp_path):
    text = SPEC.replace('"strategy.name" = ["allreduce", "dpsgd"]',
                        'method = [{label = "diloco+qsgd", strategy = {name = "diloco", '
                        'period = 5}, compression = {name = "qsgd", levels = 7}}]\n'
                        'deployment = [{label = "4 real", mode = "run", run = {workers = 4}}, '
                        '{run = {workers = 8}, network = {bandwidth = "1Gbit"}}]')
    matrix = cells(*load_spec(_spec(tmp_path, text)))
    assert [(c.mode, c.config["run"]["workers"], c.config["network"]["bandwidth"])
            for c in matrix[::3]] == [("run", 4, "10Gbit"), ("simulate", 8, "1Gbit")]
    assert {(c.config["strategy"]["period"], c.config["compression"]["levels"])
            for c in matrix} == {(5, 7)}
    assert [c.label for c in matrix[::3]] == [
        "method=diloco+qsgd deployment=4real run.seed=1",
        "method=diloco+qsgd deployment=8/1Gbit run.seed=1"]


def test_mlperf_drops_the_fastest_and_the_slowest():
    assert mlperf_score([4.0, 1.0, 2.0, 3.0, 10.0]) == 3.0
    assert mlperf_score([4.0, 1.0, 2.0, 3.0, None]) == 3.0  # not reached: the slowest
    assert mlperf_score([1.0, None, None]) is None  # twice: the cell has not reached it
    assert mlperf_score([1.0, 2.0]) == 1.5 and mlperf_score([1.0, None]) is None


@pytest.mark.parametrize("extra,says", [
    ('"run.wrkers" = [1, 2]\n', "axes.run.wrkers: no such key run.wrkers"),
    ('network = [{bandwidth = "1Gbit", latncy = "1ms"}]\n', "no such key network.latncy"),
    ('network = ["1Gbit"]\n', "axes.network: a section's values are tables"),
    ('"run.workers" = []\n', "axes.run.workers: give a non-empty list"),
    ('"run.workers" = [0]\n', "the cell strategy.name=allreduce run.seed=1 run.workers=0: "),
    ('"mode" = ["simulated"]\n', "axes.mode: 'simulated' is not 'simulate', 'run' or 'hosts'"),
    ('deployment = [4]\n', "axes.deployment: not a section of the configuration, so a joint"),
    ('deployment = [{rn = {workers = 4}}]\n', "axes.deployment: rn is neither a section"),
    ('deployment = [{run = {wrkers = 4}}]\n', "axes.deployment: no such key run.wrkers"),
    ('deployment = [{mode = "real"}]\n', "axes.deployment's mode: 'real' is not 'simulate'"),
    # what a strategy checks of the workers, before any cell runs
    ('strategy = [{name = "dpsgd", topology = "torus"}]\n"run.workers" = [4, 7]\n',
     "the cell strategy.name=allreduce run.seed=1 strategy=dpsgd/torus run.workers=7: torus: "
     "7 workers do not fit"),
    ('strategy = [{name = "ps", servers = 3}]\n', "strategy.servers = 3 but there are only 2"),
])
def test_a_bad_axis_is_one_line(tmp_path, capsys, extra, says):
    assert main(["bench", str(_spec(tmp_path, SPEC + extra))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("text,says", [
    (SPEC.replace("run.steps = 30", "run.stepz = 30"),
     "sweep.toml [base]: unknown config key 'run.stepz' (did you mean run.steps?)"),
    ('[bench]\nmode = "simulate"\n', "sweep.toml: neither [base] nor [axes]"),
    (None, "bench spec not found: "),
])
def test_a_bad_spec_is_one_line_naming_the_spec(tmp_path, capsys, text, says):
    spec = _spec(tmp_path, text) if text is not None else tmp_path / "nowhere.toml"
    assert main(["bench", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_a_matrix_over_max_cells_needs_yes(tmp_path, capsys):
    assert main(["bench", str(_spec(tmp_path)), "--max-cells", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "6 cells, more than --max-cells 5" in err


def test_an_out_that_cannot_be_a_folder_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "ok.toml"
    a_file.write_text("")
    assert main(["bench", str(_spec(tmp_path)), "--out", str(a_file)]) == 2
    assert capsys.readouterr().err == (f"fastsgd: error: bench folder {a_file}: cannot make "
                                       f"{a_file / 'cells'} (Not a directory)\n")


@pytest.mark.parametrize("flags, says", [
    (["--jobs", "0"], "--jobs 0: it must be 1 or more"),
    (["--jobs", "-1"], "--jobs -1: it must be 1 or more"),
    (["--max-cells", "-5"], "--max-cells -5: it must be 1 or more")])
def test_bad_counts_are_one_line(tmp_path, capsys, flags, says):
    assert main(["bench", str(_spec(tmp_path)), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_a_bench_does_not_write_into_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    assert main(["bench", str(_spec(tmp_path)), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a run" in err and not (run / "cells").exists()


@pytest.mark.multiproc
def test_a_bench_runs_reports_and_resumes(tmp_path, capsys):
    spec, out = _spec(tmp_path, SPEC.replace('"dpsgd"]', '"dpsgd", "nosuch"]')), tmp_path / "b"
    assert main(["bench", str(spec), "--out", str(out)]) == 2  # refused before any cell runs
    assert "nosuch" in capsys.readouterr().err and not (out / "cells").exists()
    spec = _spec(tmp_path, SPEC.replace('["allreduce", "dpsgd"]', '["dpsgd"]'))
    assert main(["bench", str(spec), "--out", str(out), "--jobs", "2", "--quiet"]) == 0
    labels = json.loads((out / "cells" / "labels.json").read_text())
    assert len(labels) == 3 and all((out / "cells" / i / "summary.json").is_file() for i in labels)
    assert not any((out / "cells" / i / "report").exists() for i in labels)  # one report: below
    markdown = (out / "report" / "report.md").read_text()
    assert "## Over seeds" in markdown and "| strategy.name=dpsgd | 3 |" in markdown
    assert capsys.readouterr().out.strip() == markdown.strip()  # the tables in the terminal
    before = {i: (out / "cells" / i / "summary.json").stat().st_mtime_ns for i in labels}
    assert main(["bench", str(spec), "--out", str(out), "--quiet"]) == 0
    assert "3 done before, 0 to run" in capsys.readouterr().err
    assert before == {i: (out / "cells" / i / "summary.json").stat().st_mtime_ns for i in labels}


@pytest.mark.multiproc
def test_a_failed_cell_is_named_and_the_others_run(tmp_path, capsys):
    text = SPEC.replace('"run.seed" = [1, 2, 3]', '"data.name" = ["digits", "idx"]').replace(
        '["allreduce", "dpsgd"]', '["allreduce"]')
    out = tmp_path / "b"
    assert main(["bench", str(_spec(tmp_path, text)), "--out", str(out), "--jobs", "2",
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "1 of 2 cells failed" in err and "data.path" in err
    assert len(list(out.glob("cells/*/summary.json"))) == 1


@pytest.mark.multiproc
def test_ctrl_c_stops_the_bench_and_the_same_command_goes_on(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    text = SPEC.replace("run.steps = 30", "run.steps = 300").replace(
        '["allreduce", "dpsgd"]', '["allreduce"]')
    spec, out = _spec(tmp_path, text), tmp_path / "b"
    command = [sys.executable, "-m", "fastsgd", "bench", str(spec), "--out", str(out),
               "--quiet"]
    # Ctrl-C's default action, even where this test runs in the background (a shell's
    # background job starts with SIGINT ignored, and Python then installs no handler)
    bench = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while not list(out.glob("cells/*.toml")):  # the first cell has started
        time.sleep(0.1)
    time.sleep(1.0)
    bench.send_signal(signal.SIGINT)  # to the bench alone, not its cells' process group
    _, err = bench.communicate(timeout=60)
    assert bench.returncode == 130, err
    assert err.strip().splitlines()[-1] == ("fastsgd: bench interrupted: 0 of 3 cells done; "
                                            "the same command goes on with the others")
    assert len(list(out.glob("cells/*.toml"))) == 1  # the queued cells never started
    for _ in range(50):  # nothing of the interrupted cell is left running (killed: gone soon)
        if not orphans(str(out)):
            break
        time.sleep(0.1)
    assert not orphans(str(out))
    assert subprocess.run(command, capture_output=True, timeout=300).returncode == 0
    assert len(list(out.glob("cells/*/summary.json"))) == 3
