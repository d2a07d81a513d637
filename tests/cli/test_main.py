"""Bad input ends in one clear line naming the culprit, a non-zero exit, no traceback."""

import os
import signal
import subprocess
import sys
import time

import pytest


def fastsgd(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fastsgd", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("args, culprit", [
    (["run", "--set", "strategy.name=nope"], "strategy.name"),
    (["run", "--set", "model.name=vgg99"], "model.name"),
    (["run", "--set", "data.name=cifar1000"], "data.name"),
    (["simulate", "--set", "run.workers=0"], "run.workers"),
    (["run", "--set", "run.workers=-1"], "run.workers"),
    (["run", "--set", "data.path=/no/such/folder"], "apt-get install dataset-fashion-mnist"),
    (["run", "--set", "run.typo=1"], "run.typo"),
    (["demo", "--set", "optimizer.lr=-1"], "optimizer.lr"),
    (["simulate", "--set", "strategy.name=ssp", "--set", "strategy.staleness=-1"],
     "strategy.staleness must be >= 0"),
    (["simulate", "--set", "strategy.name=localsgd", "--set", "strategy.period=0"],
     "strategy.period must be >= 1"),
    (["simulate", "--set", "strategy.name=easgd", "--set", "strategy.alpha=1.5"],
     "strategy.alpha must be 0 (auto) or in (0, 1)"),
    (["simulate", "--set", "strategy.name=ssp", "--set", "strategy.staleness=1.5"],
     "strategy.staleness must be of type int"),
    (["simulate", "--set", "strategy.name=dpsgd", "--set", "strategy.topology=moebius"],
     "strategy.topology"),
    (["simulate", "--set", "strategy.name=dpsgd", "--set", "strategy.topology=torus",
      "--set", "run.workers=7", "--set", "data.name=synthetic"], "strategy.rows"),
    (["simulate", "--set", "strategy.name=dpsgd", "--set", "strategy.period=3"],
     "unknown config key 'strategy.period'"),
    (["simulate", "--set", "strategy.name=ps", "--set", "strategy.servers=9"],
     "strategy.servers"),
    (["simulate", "--set", "compute.slowdown=[1, 0.5]"], "compute.slowdown"),
    (["run", "--set", "compression.name=zip"], "unknown codec 'zip' (compression.name)"),
    (["run", "--set", "compression.name=topk", "--set", "compression.ratio=0"],
     "compression.ratio must be in (0, 1]"),
    (["run", "--set", "compression.name=randomk", "--set", "compression.ratio=1.5"],
     "compression.ratio must be in (0, 1]"),
    (["run", "--set", "compression.name=qsgd", "--set", "compression.levels=0"],
     "compression.levels must be >= 1"),
    (["run", "--set", "compression.name=powersgd", "--set", "compression.rank=0"],
     "compression.rank must be >= 1"),
    (["run", "--set", "compression.name=fp16", "--set", "compression.ratio=0.1"],
     "unknown config key 'compression.ratio'"),
    (["simulate", "--set", "strategy.name=hogwild", "--set", "compression.name=topk",
      "--set", "data.name=synthetic"], "compression.name = 'topk'"),
    (["simulate", "--set", "strategy.name=dpsgd", "--set", "strategy.topology=onepeer",
      "--set", "compression.name=topk", "--set", "data.name=synthetic"],
     "strategy.topology = 'onepeer'"),
    (["run", "--set", "compression.name=onebit", "--set", "optimizer.momentum=0",
      "--set", "strategy.momentum_correction=on", "--set", "data.name=synthetic"],
     "strategy.momentum_correction = 'on' but the optimizer (SGD) has no momentum"),
    (["run", "--set", "strategy.name=diloco", "--set", "strategy.fragments=99",
      "--set", "strategy.period=8",
      "--set", "data.name=synthetic", "--set", "model.name=mlp"],
     "strategy.fragments must be <= the model's 6 parameter tensors"),
    (["simulate", "--set", "strategy.name=diloco", "--set", "strategy.overlap=500"],
     "strategy.overlap must be < strategy.period (500)"),
    (["simulate", "--set", "strategy.momentum_correction=yes"],
     "strategy.momentum_correction must be one of"),
    (["simulate", "--set", "strategy.name=dpsgd", "--set", "strategy.rows=2"],
     'strategy.rows is for topology torus; strategy.topology = "ring" does not use it'),
    (["simulate", "--set", "strategy.name=dpsgd", "--set", "strategy.topology=custom",
      "--set", 'strategy.edges=["0-1"]'], "strategy.edges[0] = '0-1' must be [a, b]"),
    (["run", "train.py"], "train.py is a Python script, not a TOML config: run it with python3"),
    (["simulate", "--data", "/no/such/folder"], "--data /no/such/folder: no such folder"),
])
def test_bad_input_is_one_line(args, culprit, capsys, tmp_path, monkeypatch):
    """In this process (the CLI's entry point, 2 s less per case than a new interpreter);
    the case below checks one end to end. Nothing is left in runs/, where a run would go."""
    from fastsgd.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    _one_line(capsys.readouterr().err, culprit)
    assert not list(tmp_path.glob("runs/*"))  # a worker found it: its folder went too


def test_bad_input_is_one_line_from_a_new_process():
    proc = fastsgd("run", "--set", "model.name=vgg99")
    assert proc.returncode == 2
    _one_line(proc.stderr, "model.name")


def _one_line(stderr: str, culprit: str) -> None:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastsgd: error:") and culprit in lines[0]


def test_malformed_toml_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nworkers = = 4\n")
    proc = fastsgd("run", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert str(bad) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_simulate_prints_a_report(tmp_path):
    proc = fastsgd("simulate", "--quiet", "--set", "data.name=synthetic", "--set", "model.name=mlp",
                   "--set", "run.steps=20", "--set", f"run.out={tmp_path / 'r'}",
                   "--set", "run.workers=8", "--set", "network.bandwidth=100Mbit")
    assert proc.returncode == 0, proc.stderr
    assert "test accuracy" in proc.stdout and "simulated" in proc.stdout
    assert str(tmp_path / "r") in proc.stdout and proc.stderr == ""
    page = tmp_path / "r" / "report" / "report.html"  # the run's own small report
    assert f"report         {page}" in proc.stdout and page.stat().st_size > 10_000


def test_no_report_leaves_the_report_out(tmp_path, capsys):
    from fastsgd.cli.main import main

    out = tmp_path / "r"
    assert main(["simulate", "--quiet", "--no-report", "--set", "data.name=synthetic",
                 "--set", "model.name=mlp", "--set", "run.steps=5",
                 "--set", f"run.out={out}"]) == 0
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and printed.rstrip().endswith(str(out))
    assert "report " not in printed and not (out / "report").exists()


def test_topology_command_prints_and_draws(tmp_path, capsys):
    from fastsgd.cli.main import main

    png = tmp_path / "torus.png"
    assert main(["topology", "torus", "--workers", "16", "--png", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "spectral gap" in printed and png.stat().st_size > 1000
    assert printed.count(":") >= 16  # one line per worker


def test_topology_command_bad_shape(capsys):
    from fastsgd.cli.main import main

    assert main(["topology", "torus", "--workers", "7"]) == 2
    _one_line(capsys.readouterr().err, "7")


def test_set_without_equals_says_the_right_form(capsys):
    from fastsgd.cli.main import main

    assert main(["run", "--set", "run.workers", "4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fastsgd: error: --set run.workers: write KEY=VALUE as one word, e.g. "
        "--set run.workers=4")


@pytest.mark.parametrize("command", ["simulate", "pack"])
def test_set_without_equals_after_a_config_file_hints_a_value(tmp_path, capsys, command):
    from fastsgd.cli.main import main

    config = tmp_path / "ok.toml"
    config.write_text("")
    assert main([command, str(config), "--set", "run.workers"]) == 2
    assert capsys.readouterr().err.strip().endswith("e.g. --set run.workers=VALUE")


def test_version():
    from fastsgd import __version__

    proc = fastsgd("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"fastsgd {__version__}"


def test_run_help_points_to_the_keys_and_keys_lists_them():
    assert "fastsgd keys" in fastsgd("run", "--help").stdout
    proc = fastsgd("keys")
    assert proc.returncode == 0
    for text in ("[run]", "workers", "log_every", "[strategy]", 'name = "dpsgd"', "gamma",
                 "[compression]", 'name = "topk"', "ratio", "[optimizer]", "module:Class"):
        assert text in proc.stdout


def test_topology_custom_from_the_command_line(tmp_path, capsys):
    from fastsgd.cli.main import main

    assert main(["topology", "custom", "--workers", "4", "--edges", "0-1,1-2,2-3,3-0",
                 "--png", str(tmp_path / "c.png")]) == 0
    assert "spectral gap" in capsys.readouterr().out


@pytest.mark.parametrize("args, culprit", [
    (["topology", "custom", "--workers", "4"], "--edges"),
    (["topology", "custom", "--workers", "4", "--edges", "0-1,1-x"], "--edges"),
    (["topology", "torus", "--workers", "8", "--rows", "3"], "--rows 3"),
    (["topology", "ring", "--workers", "4", "--png", "out.txt"],
     "--png out.txt: the drawing is a PNG; give it a name ending in .png"),
    (["topology", "ring", "--workers", "4", "--png", "/nonexistent/dir/x.png"],
     "--png /nonexistent/dir/x.png: no such folder /nonexistent/dir"),
    (["topology", "ring", "--workers", "100000"], "--workers 100000: fastsgd topology shows 1 "
                                                  "to 2048 workers"),
    (["topology", "ring", "--workers", "99999999999999999999"], "--workers 9999"),
    (["topology", "star", "--workers", "1000000000"], "--workers 1000000000"),
    (["topology", "ring", "--workers", "0"], "--workers 0"),
    (["topology", "onepeer", "--workers", "8", "--step", "-1"], "--step -1"),
    (["topology", "ring", "--workers", "4", "--edges", "0-1"],
     "--edges is for topology custom; topology ring does not use it"),
    (["topology", "ring", "--workers", "4", "--rows", "2"], "--rows is for topology torus"),
    (["topology", "complete", "--workers", "4", "--cols", "0"], "--cols is for topology torus"),
    (["topology", "torus", "--workers", "8", "--degree", "3"], "--degree is for topology random"),
    (["topology", "ring", "--workers", "4", "--seed", "1"], "topology ring does not use it"),
    (["topology", "mesh", "--workers", "4"], "unknown topology 'mesh'; choose one of"),
    (["topology", "hypercube", "--workers", "6"], "topology hypercube needs a power-of-two"),
    (["topology", "torus", "--workers", "7"], "or topology ring"),
])
def test_topology_errors_name_the_flag(args, culprit, capsys):
    from fastsgd.cli.main import main

    assert main(args) == 2
    out, err = capsys.readouterr()
    _one_line(err, culprit)
    assert "strategy." not in err and "NAME" not in err and out == ""


@pytest.mark.parametrize("png", ["folder.png", "/proc/fastsgd-test.png", "/sys/fastsgd-test.png"])
def test_topology_png_that_cannot_be_written(tmp_path, monkeypatch, capsys, png):
    from fastsgd.cli.main import main

    monkeypatch.chdir(tmp_path)  # /proc and /sys: Linux's, as fastsgd's workers (forked)
    (tmp_path / "folder.png").mkdir()
    assert main(["topology", "ring", "--workers", "4", "--png", png]) == 2
    err = capsys.readouterr().err
    _one_line(err, f"--png {png}: ")  # and the reason, as the OS gives it
    assert any(r in err for r in ("is a folder", "No such file", "Permission denied",
                                  "Read-only")), err


def test_topology_png_errors_give_the_reason(tmp_path, monkeypatch, capsys):
    from matplotlib.figure import Figure

    from fastsgd.cli.main import main

    def refuse(*_, **__):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Figure, "savefig", refuse)
    png = tmp_path / "x.png"
    assert main(["topology", "ring", "--workers", "4", "--png", str(png)]) == 2
    _one_line(capsys.readouterr().err, f"--png {png}: cannot write it: Permission denied")


def test_topology_of_many_workers_draws_the_ranks_only(tmp_path, capsys):
    from fastsgd.cli.main import main

    png = tmp_path / "c.png"
    assert main(["topology", "complete", "--workers", "400", "--png", str(png)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"drawing: {png} (the ranks only: 79800 edges are more than the 50000 it draws)"
    assert png.stat().st_size > 1000


def test_topology_help_says_its_bounds():
    text = " ".join(fastsgd("topology", "--help").stdout.split())  # as argparse wraps it
    assert "1 to 2048" in text and ">= 0" in text and "torus" in text and "50000 edges" in text


def test_report_grammar(tmp_path, capsys):
    from fastsgd.cli.main import main

    assert main(["simulate", "--quiet", "--no-report", "--set", "data.name=synthetic", "--set",
                 "model.name=mlp", "--set", "run.steps=1", "--set", "run.workers=1",
                 "--set", f"run.out={tmp_path / 'r'}"]) == 0
    printed = capsys.readouterr().out
    assert "| 1 worker | 1 step (" in printed and "1 evaluation (" in printed


def test_readme_links_stay_inside_the_repository():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)", text) + re.findall(r"`(\.\./[^`]*)`", text):
        if target.startswith(("http://", "https://")):
            continue
        assert (root / target).resolve().is_relative_to(root), target
        assert (root / target).exists(), target


def test_the_command_line_imports_torch_inside_its_error_handling():
    # so that Ctrl-C during torch's seconds of import ends like any other (the test below)
    code = ("import sys, fastsgd, fastsgd.cli.main; assert 'torch' not in sys.modules; "
            "print(fastsgd.Job.__name__, fastsgd.data.__name__); assert 'torch' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Job", "fastsgd.workloads.data"]


@pytest.mark.parametrize("after", [1.0, 2.5])
def test_ctrl_c_while_starting_is_one_line(tmp_path, after):
    proc = subprocess.Popen([sys.executable, "-m", "fastsgd", "run", "--set", "data.name=digits",
                             "--set", f"run.out={tmp_path / 'run'}", "--quiet"],
                            stderr=subprocess.PIPE, text=True,  # SIGINT as from a terminal:
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after)  # importing torch takes 1-4 s
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.startswith("fastsgd: interrupted") and len(err.splitlines()) == 1, err[-3000:]


def test_an_interrupt_inside_a_string_exec_still_ends_with_130(tmp_path):
    # the CI failure of 2026-12-03: Ctrl-C while torch's import ran a dataclass's generated
    # code; `python -m fastsgd` said "fastsgd: interrupted" and then died by SIGINT
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import sys\nfrom fastsgd.cli import main as cli\n\n\ndef dispatch(args):\n"
        "    exec('raise KeyboardInterrupt')\n\n\ncli._dispatch = dispatch\n"
        "sys.exit(cli.main(['keys']))\n")
    done = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (130, "fastsgd: interrupted\n")


def test_a_folder_as_config_is_one_line(tmp_path):
    done = fastsgd("simulate", str(tmp_path), "--set", "run.steps=1", cwd=tmp_path)
    assert done.returncode == 2
    _one_line(done.stderr, f"cannot read config file {tmp_path}: Is a directory")


def test_a_reader_that_leaves_early_is_no_traceback():
    # `fastsgd keys | head -3`: head may close the pipe before the last write; here it is
    # closed before the first
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run([sys.executable, "-m", "fastsgd", "keys"], stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    os.close(write)
    assert (done.returncode, done.stderr) == (128 + signal.SIGPIPE, "")
