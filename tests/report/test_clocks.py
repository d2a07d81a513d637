"""A report names the clock of every time it shows: simulated (virtual seconds of the
network model), measured (wall clock of real processes) or, for a summary that does not
say, unknown; where its runs mix them it says so in one line, and its time plots give each
clock its own panel and axis."""

import csv
import io
import json
import shutil
from dataclasses import replace

import pytest

import fastsgd as fs
from fastsgd.cli.main import main
from fastsgd.report import load_run, plots, text_report, write_report
from fastsgd.report.table import over_seeds, rows, seed_columns, to_markdown

COMMON = {"data.name": "digits", "model.name": "mlp", "run.steps": 30, "run.eval_every": 10,
          "run.workers": 2, "compute.model": "fixed", "compute.step_time": "2ms"}
MIXED = "times are on different clocks"


def _copy(source, dest, drop=(), env=None, **summary):
    """A copy of a run directory, its summary less `drop` and with `summary`'s keys, and
    environment.json's backend `env` (None: no environment.json)."""
    shutil.copytree(source, dest)
    s = json.loads((dest / "summary.json").read_text())
    s = {k: v for k, v in {**s, **summary}.items() if k not in drop}
    (dest / "summary.json").write_text(json.dumps(s))
    if env is None:
        (dest / "environment.json").unlink()
    else:
        (dest / "environment.json").write_text(json.dumps({"backend": env}))
    return dest


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A simulated run and copies of it as a real run wrote it (mode real, no simulated
    time, the gloo backend), as one before `mode` and `simulated_time` with its
    environment.json, and as one with neither."""
    root = tmp_path_factory.mktemp("clocks")
    sim = fs.Job(options={**COMMON, "run.out": str(root / "sim")}, quiet=True).simulate().run_dir
    real = _copy(sim, root / "real", env="gloo", mode="real", simulated_time=None)
    return {"sim": sim, "real": real,
            "old-real": _copy(real, root / "old-real", ("mode", "simulated_time"), env="gloo"),
            "old-sim": _copy(sim, root / "old-sim", ("mode", "simulated_time"), env="simulated"),
            "old": _copy(sim, root / "old", ("mode", "simulated_time"))}


def test_each_run_says_which_clock_its_times_are_on(runs):
    clocks = {name: load_run(path).clock for name, path in runs.items()}
    assert clocks == {"sim": "simulated", "real": "measured", "old-real": "measured",
                      "old-sim": "simulated", "old": "unknown"}
    assert load_run(runs["sim"]).environment["backend"] == "simulated"  # what old-sim copies
    assert load_run(runs["old-sim"]).training_time() is None  # not its wall time as virtual
    assert load_run(runs["old-real"]).training_time() == load_run(runs["real"]).summary[
        "wall_time"]


def test_every_table_names_the_clock_of_its_times(runs, tmp_path):
    for name, clock in (("sim", "simulated"), ("real", "measured")):
        write_report([load_run(runs[name])], tmp_path / name)
        header, _, row = (tmp_path / name / "report.md").read_text().splitlines()[2:5]
        cells = [c.strip() for c in row.split("|")]
        at = [c.strip() for c in header.split("|")].index("clock")
        assert cells[at] == clock and cells[at + 1].endswith(" s")  # time to 88%, beside it
        table = csv.DictReader(io.StringIO((tmp_path / name / "report.csv").read_text()))
        assert [r["clock"] for r in table] == [clock]
    real = load_run(runs["real"])
    other_seed = replace(real, config={**real.config, "run": {**real.config["run"], "seed": 9}})
    seeds = over_seeds([real, other_seed])
    assert "| clock |" in to_markdown(seeds, seed_columns(seeds))
    assert "| measured |" in to_markdown(seeds, seed_columns(seeds))


def test_a_report_that_mixes_clocks_says_so_in_one_line(runs, tmp_path, capsys):
    out = tmp_path / "mixed"
    assert main(["report", str(runs["sim"]), str(runs["real"]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for text in (printed, (out / "report.md").read_text(), (out / "report.html").read_text()):
        assert text.count(MIXED) == 1
        line = next(line for line in text.splitlines() if MIXED in line)
        assert "1 run simulated" in line and "1 run measured" in line
    assert main(["report", str(runs["sim"]), "--out", str(tmp_path / "one")]) == 0
    assert MIXED not in capsys.readouterr().out
    assert MIXED not in (tmp_path / "one" / "report.html").read_text()


@pytest.fixture
def xlabels(monkeypatch):
    """The x-axis labels the plots set, in order."""
    from matplotlib.axes import Axes

    said, set_xlabel = [], Axes.set_xlabel

    def record(ax, text, *args, **kwargs):
        said.append(text)
        return set_xlabel(ax, text, *args, **kwargs)
    monkeypatch.setattr(Axes, "set_xlabel", record)
    return said


def _width(png):
    return int.from_bytes(png[16:20], "big")  # the PNG header's


def test_time_axes_name_their_clock_and_mixed_clocks_get_a_panel_each(runs, xlabels):
    sim, real = load_run(runs["sim"]), load_run(runs["real"])
    one = plots.accuracy_vs_time([sim])
    assert xlabels == ["training time (s, simulated)"]
    plots.accuracy_vs_time([real])
    assert xlabels[1:] == ["training time (s, measured wall clock)"]
    both = plots.accuracy_vs_time([real, sim])  # simulated first, each on its own axis
    assert xlabels[2:] == ["training time (s, simulated)", "training time (s, measured wall clock)"]
    assert _width(both) > _width(one)
    plots.breakdown(rows([sim]))
    plots.breakdown(rows([sim, real]))
    assert xlabels[4:] == ["ms per step (mean over workers and steps; simulated)",
                           "ms per step (mean over workers and steps; each run's own clock)"]


def test_a_summary_that_predates_the_marker_still_reports(runs, tmp_path, capsys, xlabels):
    out = tmp_path / "old"
    assert main(["report", str(runs["old"]), str(runs["old-real"]), "--out", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    assert "| unknown |" in markdown and "| measured |" in markdown
    assert "1 run on an unknown clock" in markdown and MIXED in capsys.readouterr().out
    assert "training time (s, clock unknown)" in xlabels
    assert "s wall" in text_report(runs["old"])  # its wall time, said as one
