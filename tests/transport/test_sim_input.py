"""Bad simulator input ends in one line naming the key or file (and line), exit code 2
(through the CLI's entry point in this process: tests/cli/test_main.py runs one case end to end)."""

import pytest

import fastsgd as fs
from fastsgd.cli.main import main
from fastsgd.errors import ConfigError
from tests.cli.test_main import _one_line

SMALL = ["--set", "data.name=synthetic", "--set", "model.name=mlp", "--set", "run.steps=2",
         "--set", "run.workers=4", "--quiet"]


def _trace(tmp_path, text):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return f"compute.trace={path}"


HEADER = "rank,start,end,speed,bandwidth\n"
CASES = [
    (["compute.model=guess"], "compute.model must be one of profile, fixed, measured"),
    (["compute.model=fixed", "compute.step_time=-5ms"], "compute.step_time must be a time"),
    (["compute.model=fixed", "compute.step_time=fast"], "compute.step_time must be a time"),
    (["compute.model=fixed"], "compute.step_time"),
    (["compute.forward=3 parsecs"], "compute.forward must be a time"),
    (["network.latency=-1ms"], "network.latency must be a time"),
    (["network.bandwidth=lots"], "network.bandwidth must be a bandwidth"),
    (["network.workers_per_node=3"], "network.workers_per_node = 3 does not divide the 4"),
    (["network.loss=1.0"], "network.loss must be in [0, 1)"),
    (["network.loss=-0.1"], "network.loss must be in [0, 1)"),
    (['network.bandwidths={7 = "1Mbit"}'], "network.bandwidths names worker 7"),
    (['network.bandwidths={1 = "fast"}'], "network.bandwidths must map worker ranks"),
    (["compute.slowdown=[1, 1, 1, 1, 50]"],
     "compute.slowdown has 5 factors but run.workers = 4: give at most one per worker"),
    (["compute.straggler_prob=1.5"], "compute.straggler_prob must be in [0, 1)"),
    (["compute.trace=/no/such/trace.csv"], "compute.trace: cannot read /no/such/trace.csv"),
    # times and rates that overflow to inf, or past the nanosecond clock
    (["network.latency=1e400s"], "network.latency must be a time"),
    (["network.rto=2e9s"], "network.rto must be a time"),
    (["compute.model=fixed", "compute.step_time=1e400s"], "compute.step_time must be a time"),
    (["network.bandwidth=1e400Gbit"], "network.bandwidth must be a bandwidth"),
    (["network.bandwidth=1e-300bit"], "network.bandwidth must be a bandwidth"),
    (['faults.crash=[{worker = 1, at = "1e400s"}]'], "faults.crash[0].at must be a finite time"),
    (['faults.down=[{worker = 1, from = "1s", to = "1e400s"}]'],
     "faults.down[0].to must be a finite time"),
    # which timing keys each compute.model takes
    (["compute.step_time=25ms"], "compute.step_time applies to compute.model = 'fixed'"),
    (["compute.model=measured", "compute.step_time=1ms"],
     "compute.step_time applies to compute.model = 'fixed'"),
    (["compute.model=measured", "compute.forward=1ms"],
     "compute.forward applies to compute.model = 'fixed'"),
    (["compute.model=fixed", "compute.step_time=0s"], "compute.step_time must be > 0"),
    (["compute.model=fixed", "compute.step_time=0.5ns"], "compute.step_time must be > 0"),
    (["compute.model=fixed", "compute.forward=1ms"], "(compute.backward is not set)"),
    (["compute.model=fixed", "compute.backward=1ms"], "(compute.forward is not set)"),
    (["compute.model=fixed", "compute.step_time=30ms", "compute.forward=1ms",
      "compute.backward=2ms"], "compute.step_time and compute.forward are both set"),
    (["compute.forward=1ms"], "compute.forward = '1ms' is not a time profile measured"),
    (["compute.sigma=10"], "compute.sigma must be in [0, 2]"),
    (["compute.sigma=2.5"], "compute.sigma must be in [0, 2]"),
    (["compute.seed=-2"], "compute.seed must be -1 (run.seed) or 0 to 2**63 - 1"),
    (["network.seed=-2"], "network.seed must be -1 (run.seed) or 0 to 2**63 - 1"),
]
TRACES = [
    ("rank,begin\n0,0s\n", "the first line must be the header"),
    (HEADER + "0,0s,,1,\n1,0s,,1\n", "line 3: expected 5 columns"),
    (HEADER + "0,0s,,1,\nx,0s,,1,\n", "line 3: rank must be an integer"),
    (HEADER + "0,0s,,1,\n1,soon,,1,\n", "line 3, start"),
    (HEADER + "# a comment\n0,0s,5s,1,\n0,2s,,1,\n", "line 4: worker 0's windows must be"),
    (HEADER + "0,0s,,1,\n1,0s,,1,\n2,0s,,1,\n", "names 3 workers but the run has 4"),
    (HEADER + "0,0s,,1,1Tbit/s/s\n", "line 2, bandwidth"),
    (HEADER + "0,1e400s,,1,\n", "line 2, start must be a finite time"),
    (HEADER + "0,0s,,nan,\n", "line 2: rank must be >= 0 and speed a number from 1e-06 to 1e+06"),
    (HEADER + "0,0s,,inf,\n", "line 2: rank must be >= 0 and speed a number from 1e-06 to 1e+06"),
    (HEADER + "0,0s,,1,1e400Gbit\n", "line 2, bandwidth"),
    (HEADER + "0,0s,,1e-300,\n", "line 2: rank must be >= 0 and speed a number from 1e-06"),
    # a row for a rank the run does not have, as network.bandwidths' override is refused
    (HEADER + "0,0s,,1,\n1,0s,,1,\n2,0s,,1,\n3,0s,,1,\n# more\n4,0s,1s,1,\n4,2s,,1,\n",
     "line 7: rank 4 does not exist: run.workers = 4, ranks go from 0 to 3"),
]


@pytest.fixture
def simulate(tmp_path, monkeypatch, capsys):
    """`fastsgd simulate SMALL ARGS` in tmp_path; checks it fails in one line naming culprit."""
    monkeypatch.chdir(tmp_path)

    def check(args, culprit):
        assert main(["simulate", *SMALL, *args]) == 2
        _one_line(capsys.readouterr().err, culprit)
    return check


@pytest.mark.parametrize("sets, culprit", CASES)
def test_bad_simulator_settings(sets, culprit, simulate):
    simulate([item for s in sets for item in ("--set", s)], culprit)


@pytest.mark.parametrize("text, culprit", TRACES)
def test_bad_trace_files(text, culprit, tmp_path, simulate):
    simulate(["--set", _trace(tmp_path, text)], culprit)


def test_a_trace_file_that_is_not_utf8_is_one_line(tmp_path, simulate):
    path = tmp_path / "trace.csv"
    path.write_bytes(HEADER.encode() + b"0,0s,,1,\xff\n")
    simulate(["--set", f"compute.trace={path}"], f"compute.trace {path} is not UTF-8 text")


SLOW = {"compute.slowdown": [1, 1, 1, 50], "data.name": "synthetic", "model.name": "mlp",
        "run.steps": 2, "compute.model": "fixed", "compute.step_time": "1ms"}


def test_slowdown_factors_count_against_the_workers_the_run_has(tmp_path):
    """Checked at the run's own number of workers: simulate(workers=) sets it."""
    with pytest.raises(ConfigError, match="^compute.slowdown has 4 factors but run.workers = "
                                          "2: give at most one per worker"):
        fs.Job(options={**SLOW, "run.out": str(tmp_path / "a")}, quiet=True).simulate(workers=2)
    assert not (tmp_path / "a").exists()
    job = fs.Job(options={**SLOW, "run.workers": 2, "run.out": str(tmp_path / "b")}, quiet=True)
    assert job.simulate(workers=4).summary["workers"] == 4


# Real processes slow down by compute.slowdown too (worker.py): the same check. It needs
# one call in Job.plan (job.py), where the number of workers is the run's, also torchrun's.
@pytest.mark.multiproc
def test_slowdown_with_more_factors_than_workers_is_refused_by_run_too(tmp_path):
    with pytest.raises(ConfigError, match="^compute.slowdown has 4 factors but run.workers = 2"):
        fs.Job(options={**SLOW, "run.out": str(tmp_path)}, quiet=True).run(workers=2)
