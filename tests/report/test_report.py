"""`fastsgd report` over run directories: the CSV, the Markdown table, the plots and the
HTML page, with the seeds' metrics computed from the runs themselves."""

import csv
import io
import re
import shutil
import subprocess

import pytest

import fastsgd as fs
from fastsgd.cli.main import main
from fastsgd.report import find_runs, load_run
from fastsgd.report.plots import log_axis
from fastsgd.report.table import rows

COMMON = {"data.name": "digits", "model.name": "mlp", "run.steps": 60, "run.eval_every": 20,
          "compute.model": "fixed", "compute.step_time": "2ms", "network.bandwidth": "1Gbit"}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A folder of four runs: allreduce on 1 and 2 workers, dpsgd on 4 (a ring), and ps on 2
    with a worker 3 times slower (stale gradients)."""
    root = tmp_path_factory.mktemp("bench")
    for name, strategy, workers in (("one", "allreduce", 1), ("two", "allreduce", 2),
                                    ("gossip", "dpsgd", 4), ("stale", "ps", 2)):
        options = {**COMMON, "run.workers": workers, "run.out": str(root / name)}
        if strategy == "ps":
            options["compute.slowdown"] = [1, 3]
        fs.Job(strategy=strategy, options=options, quiet=True).simulate()
    return root


def test_report_writes_the_table_the_plots_and_the_page(bench, tmp_path, capsys):
    assert main(["report", str(bench), "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    table = list(csv.DictReader(io.StringIO((out / "report.csv").read_text())))
    assert [r["run"] for r in table] == ["gossip", "one", "stale", "two"]
    for name in ("accuracy_time", "accuracy_bytes", "breakdown", "scaling", "consensus",
                 "staleness"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    page = (out / "report.html").read_text()
    assert page.count("src='data:image/png;base64,") == 6 and "<table id='runs'>" in page
    markdown = (out / "report.md").read_text()
    assert sum(line.startswith("| ") for line in markdown.splitlines()) == 5
    assert markdown in "# fastsgd report\n\n" + capsys.readouterr().out


def test_scaling_efficiency_is_against_the_one_worker_run_of_the_same_job(bench):
    runs = find_runs([bench])
    table = {r["run"]: r for r in rows(runs)}
    one, two = (load_run(bench / n).summary["samples_per_second"] for n in ("one", "two"))
    assert table["two"]["scaling_efficiency"] == pytest.approx(two / (2 * one))
    assert table["one"]["scaling_efficiency"] == 1.0
    # no 1-worker dpsgd run: at one worker every strategy is plain SGD, so allreduce's
    gossip = load_run(bench / "gossip").summary["samples_per_second"]
    assert table["gossip"]["scaling_efficiency"] == pytest.approx(gossip / (4 * one))


def test_bytes_and_epochs_come_from_the_logged_steps(bench):
    run = load_run(bench / "two")
    sent = run.bytes_until()
    assert sent[-1][1] == run.summary["bytes_sent_total"]
    row = rows([run])[0]
    first = next(e["step"] for e in run.evals if e["accuracy"] >= 0.88)
    assert row["epochs_to_target"] == pytest.approx(first * run.summary["epochs"] / 60)
    assert row["bytes_per_step"] == run.summary["bytes_sent_total"] / 60


def _summary_only(folder):
    (folder / "r").mkdir()
    (folder / "r" / "summary.json").write_text("{}")
    return folder / "r"


def _a_file(folder):
    (folder / "bench.toml").write_text("")
    return folder / "bench.toml"


@pytest.mark.parametrize("make,says", [
    (lambda d: d, "no run directory in it"),
    (_summary_only, "not a finished run directory (no metrics.jsonl, eval.jsonl)"),
    (lambda d: d / "absent", "no such run or bench directory"),
    (_a_file, "a file, not a run or bench directory"),
])
def test_what_is_not_a_run_is_one_line(tmp_path, capsys, make, says):
    path = make(tmp_path)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and says in err


@pytest.mark.parametrize("name, damage, says", [
    ("summary.json", lambda text: "{}", "not a fastsgd run summary (no strategy, compressor"),
    ("summary.json", lambda text: "[1, 2]", "a damaged file (a JSON list, not an object)"),
    ("summary.json", lambda text: re.sub(r'"final_accuracy": [^,]*', '"final_accuracy": "x"',
                                         text), "a damaged file (final_accuracy is 'x', not a "
                                                "number)"),
    ("metrics.jsonl", lambda text: text[:-30],
     "line 120 is damaged (Unterminated string starting at column "),
    ("metrics.jsonl", lambda text: text + "\n[1]\n", "line 122 is not a fastsgd record (a JSON "
     "list, not an object)"),
    ("metrics.jsonl", lambda text: '{"step": 1, "forward": true}\n' + text,
     "line 1 is not a fastsgd record (no number for bytes_sent, io, h2d, forward, backward"),
    ("eval.jsonl", lambda text: text.replace('"accuracy": ', '"accuracy": "', 1),
     "line 1 is damaged ("),
    ("eval.jsonl", lambda text: text.replace('"accuracy"', '"acc"', 1),
     "line 1 is not a fastsgd record (no number for accuracy)"),
])
def test_a_damaged_file_is_named_in_one_line(bench, tmp_path, capsys, name, damage, says):
    run = shutil.copytree(bench / "two", tmp_path / "run")
    (run / name).write_text(damage((run / name).read_text()))
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run / name}: {says}" in err


def test_an_out_that_cannot_be_a_folder_is_one_line(bench, tmp_path, capsys):
    a_file = tmp_path / "ok.toml"
    a_file.write_text("")
    assert main(["report", str(bench / "two"), "--out", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err == f"fastsgd: error: report folder {a_file}: cannot make it (a file is in the way)\n"


def _screenshot(page, shot):
    from matplotlib.image import imread

    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", "--window-size=1000,3000", f"--screenshot={shot}",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    pixels = imread(shot)[..., :3]
    # the table: dark text in the top band; the plots: matplotlib's first colours (C0 blue,
    # C1 orange) below it, which only a decoded image can show
    top, rest = pixels[:300], pixels[300:]
    text = (top.max(axis=-1) < 0.3).mean()
    blue = (abs(rest - [0.12, 0.47, 0.71]).max(axis=-1) < 0.08).mean()
    orange = (abs(rest - [1.0, 0.5, 0.05]).max(axis=-1) < 0.08).mean()
    return text, blue, orange


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (.ci/run installs it)")
def test_the_page_renders_in_headless_chromium(bench, tmp_path):
    main(["report", str(bench), "--out", str(tmp_path / "out")])
    page = tmp_path / "out" / "report.html"
    text, blue, orange = _screenshot(page, tmp_path / "shot.png")
    assert text > 0.005 and blue > 0.0005 and orange > 0.0002, (text, blue, orange)
    # the same page with its images damaged shows the table and none of the plots' colours
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("base64,", "base64,AAAA"))
    text, blue, orange = _screenshot(broken, tmp_path / "broken.png")
    assert text > 0.005 and blue < 0.0001 and orange < 0.0001, (text, blue, orange)


def test_repeats_are_runs_of_one_job_in_one_mode(bench):
    from dataclasses import replace

    from fastsgd.report.table import over_seeds

    run = load_run(bench / "two")
    other_seed = replace(run, config={**run.config, "run": {**run.config["run"], "seed": 9}})
    assert [r["seeds"] for r in over_seeds([run, other_seed])] == [2]
    real = replace(other_seed, summary={**run.summary, "mode": "real"})
    assert over_seeds([run, real]) == []  # a simulation and a real run are not repeats


def test_a_run_given_twice_is_one_run_and_one_seed_is_not_a_spread(bench):
    from dataclasses import replace

    from fastsgd.report.runs import find_runs
    from fastsgd.report.table import over_seeds

    runs = find_runs([bench / "two", f"{bench / 'two'}/", bench / "." / "two"])
    assert len(runs) == 1
    run = runs[0]
    again = replace(run, path=run.path.with_name("copy"))  # the same seed, another folder
    assert over_seeds([run, again]) == []
    other_seed = replace(run, config={**run.config, "run": {**run.config["run"], "seed": 9}})
    assert [r["seeds"] for r in over_seeds([run, again, other_seed])] == [2]


@pytest.mark.parametrize("low, high", [(300.0, 900.0), (0.0, 4e4), (20.0, 30.0), (90.0, 600.0),
                                       (100.0, 3000.0), (0.5, 1.5)])
def test_the_bytes_axis_has_ticks_to_read_within_one_decade_too(low, high):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    ax.plot([low, high], [0.5, 0.9])
    log_axis(ax.xaxis, low, high)
    ax.set_xlim(low, high)
    ticks = [x for x in ax.get_xticks() if low <= x <= high]
    assert len(ticks) >= 2, ticks


def test_a_scaling_plot_of_a_bench_over_workers_alone_names_its_curve(bench):
    """A bench whose only axis is run.workers: its curve is named by its strategy and codec,
    not by an empty label, and no legend is drawn empty (matplotlib warned of one)."""
    import warnings
    from dataclasses import replace

    from matplotlib.axes import Axes

    from fastsgd.report.plots import scaling

    runs = [replace(load_run(bench / name), label=f"run.workers={n}")
            for name, n in (("one", 1), ("two", 2))]
    table = rows(runs)
    assert [r["series"] for r in table] == ["allreduce/none"] * 2
    legends, legend = [], Axes.legend
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Axes, "legend", lambda ax, *a, **k: legends.append(
                ax.get_legend_handles_labels()[1]) or legend(ax, *a, **k))
            assert scaling(table) is not None
            for row in table:  # a curve without a name: no legend at all
                row["series"] = ""
            assert scaling(table) is not None
    assert legends == [["allreduce/none"]]
