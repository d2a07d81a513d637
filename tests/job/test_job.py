"""`Job`: what it refuses before any worker starts, and how options meet a config file."""

import pytest

import fastsgd.job
from fastsgd import Job
from fastsgd.config import schema as cfg
from fastsgd.errors import ConfigError, UserError
from fastsgd.strategies import CHOICES

SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 3}


def test_a_global_batch_over_the_training_set_fails_before_forking(tmp_path, monkeypatch):
    def forked(*args, **kwargs):
        raise AssertionError("workers were started")
    monkeypatch.setattr(fastsgd.job, "supervise", forked)
    job = Job(options={**SMALL, "run.workers": 1000, "run.out": str(tmp_path / "run")},
              quiet=True)
    with pytest.raises(UserError, match="data.batch_size 32 x 1000 workers exceeds the"):
        job.run()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("raw", [{"run": 5}, {"run": [1, 2]}, {"run": [{"workers": 2}]},
                                 {"model": 5}])
def test_a_section_that_is_not_a_table_fails_before_options_go_in(raw):
    with pytest.raises(ConfigError, match=r"must be a table of key = value"):
        Job(config=raw, options=SMALL)


def test_a_file_section_that_is_not_a_table_names_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("model = 5\n")
    with pytest.raises(ConfigError, match=r"c.toml: \[model\] must be a table"):
        Job(config=path)


def test_another_strategy_runs_a_written_config(tmp_path):
    path = tmp_path / "config.toml"  # as a run writes it: all of allreduce's options
    path.write_text(cfg.to_toml(Job(options=SMALL).config))
    job = Job(config=path, options={"strategy.name": "dpsgd"})
    assert job.config["strategy"]["name"] == "dpsgd" and "bucket_mb" not in job.config["strategy"]
    assert Job(config=path, strategy="sgp").config["strategy"]["name"] == "sgp"
    with pytest.raises(ConfigError, match="unknown config key 'strategy.bucket_mb'"):
        Job(config=path, options={"strategy.name": "dpsgd", "strategy.bucket_mb": 5})


def test_an_archive_is_its_own_model_packed(tmp_path):
    archive = tmp_path / "job.fsj"
    archive.write_bytes(b"")  # refused before it is read
    with pytest.raises(ConfigError, match="model.packed = 'other.fsj': .*job.fsj is a job"):
        Job(config=archive, options={"model.packed": "other.fsj"})


def _fails_on_worker_1(model, batch):
    import os

    import torch.nn.functional as F
    if os.environ["RANK"] == "1":
        raise ValueError("the user's step fails on worker 1")
    x, y = batch
    return F.cross_entropy(model(x), y)


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd"])
def test_a_worker_whose_step_fails_ends_the_run_at_once(tmp_path, strategy):
    """Its peer waits for it in the step's collective: the failed worker says no goodbye,
    which would wait for the peer's (30 s, the messenger's timeout) before it reports."""
    import time

    from fastsgd.errors import WorkerFailed
    job = Job(step=_fails_on_worker_1, options={**SMALL, "strategy.name": strategy,
                                                "run.out": str(tmp_path / "run")}, quiet=True)
    began = time.monotonic()
    with pytest.raises(WorkerFailed, match=f"^worker 1 failed in step 1 of strategy '{strategy}': "
                                           "ValueError: the user's step"):
        job.run()
    assert time.monotonic() - began < 20


SIM = {**SMALL, "run.steps": 6, "run.eval_every": 0, "data.batch_size": 16}
FIXED = {"compute.model": "fixed", "compute.step_time": "3ms"}


def _same_run(a, b):
    assert a.summary["simulated_time"] == b.summary["simulated_time"]
    for name in ("model.pt", "metrics.jsonl"):
        assert (a.run_dir / name).read_bytes() == (b.run_dir / name).read_bytes(), name


def test_objects_given_to_simulate_are_recorded_and_repeat(tmp_path):
    """A Network and a ComputeModel given to Job.simulate are written into config.toml as
    their keys (seeds other than the run's too), so the file repeats the run."""
    from fastsgd.transport.sim import ComputeModel, Heterogeneity, Network

    net = Network.parse("1Mbit", "20ms", jitter="1ms", loss=0.05, seed=7,
                        bandwidths={"1": "300kbit"})
    spread = Heterogeneity((1, 2), straggler_prob=0.2, straggler_factor=3, sigma=0.3, seed=5)
    compute = ComputeModel("fixed", {"forward": 1_000_000, "backward": 2_000_001,
                                     "update": 50_000}, 3e9, spread)
    first = Job(options={**SIM, "run.out": str(tmp_path / "a")}, quiet=True).simulate(
        network=net, compute=compute)
    written = cfg.load(CHOICES, first.run_dir / "config.toml")
    assert (written["network"]["bandwidth"], written["network"]["latency"],
            written["network"]["seed"]) == ("1Mbit", "20ms", 7)
    assert (written["compute"]["model"], written["compute"]["backward"],
            written["compute"]["seed"]) == ("fixed", "2000001ns", 5)
    again = Job(config=first.run_dir / "config.toml", options={"run.out": str(tmp_path / "b")},
                quiet=True).simulate()
    _same_run(first, again)


@pytest.mark.parametrize("given, culprit", [
    ("profile", r"^Job.simulate\(compute=ComputeModel\('profile', ...\)\): give 'fixed'"),
    ("trace", r"^Job.simulate\(compute=ComputeModel\(...\)\): its trace cannot be written"),
    ("network", r"^Job.simulate\(network=Network\(...\)\): network.bandwidth must be"),
    ("slowdown", r"^Job.simulate\(compute=ComputeModel\(...\)\): compute.slowdown must be"),
])
def test_objects_that_cannot_be_written_as_keys_are_refused(given, culprit, tmp_path):
    from fastsgd.transport.sim import ComputeModel, Heterogeneity, Network, Trace
    from fastsgd.transport.sim.trace import Window

    times = {"forward": 1000, "backward": 2000}
    path = tmp_path / "t.csv"
    path.write_text("rank,start,end,speed,bandwidth\n0,0s,,1,\n1,0s,,1,\n")
    windows = {r: (Window(0, 10 ** 9, 1.0, None),) for r in (0, 1)}  # not the file's
    objects = {"profile": {"compute": ComputeModel("profile", times)},
               "trace": {"compute": ComputeModel("fixed", times, trace=Trace(str(path),
                                                                               windows))},
               "network": {"network": Network(bandwidth=0.0)},
               "slowdown": {"compute": ComputeModel(spread=Heterogeneity((0.5,)))}}[given]
    job = Job(options={**SIM, **FIXED, "run.out": str(tmp_path / "run")}, quiet=True)
    with pytest.raises(ConfigError, match=culprit):
        job.simulate(**objects)
    assert not (tmp_path / "run").exists()


def test_a_relative_trace_is_recorded_absolute(tmp_path, monkeypatch):
    """Read from the working directory, as data.path is; config.toml repeats the run from
    anywhere."""
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "ok.csv").write_text("rank,start,end,speed,bandwidth\n"
                                             "0,0s,,1,\n1,0s,,0.5,\n")
    monkeypatch.chdir(tmp_path / "here")
    first = Job(options={**SIM, **FIXED, "compute.trace": "ok.csv",
                         "run.out": str(tmp_path / "a")}, quiet=True).simulate()
    written = cfg.load(CHOICES, first.run_dir / "config.toml")["compute"]["trace"]
    assert written == str(tmp_path / "here" / "ok.csv")
    monkeypatch.chdir(tmp_path)
    again = Job(config=first.run_dir / "config.toml", options={"run.out": str(tmp_path / "b")},
                quiet=True).simulate()
    _same_run(first, again)


@pytest.mark.parametrize("quiet", [False, True])
def test_the_api_ends_a_run_as_the_cli_does_with_its_report_and_summary(quiet, tmp_path, capsys):
    options = {**SMALL, "compute.model": "fixed", "compute.step_time": "2ms",
               "run.out": str(tmp_path / "run")}
    result = Job(options=options, quiet=quiet).simulate()
    out = capsys.readouterr().out
    assert (result.run_dir / "report" / "report.html").exists() is not quiet
    assert ("test accuracy" in out and out.rstrip().endswith(str(result.run_dir))) is not quiet


def test_a_config_files_relative_paths_name_files_beside_it(tmp_path, monkeypatch):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "job.toml").write_text(
        '[data]\nname = "text"\npath = "corpus:/abs/other"\n[compute]\ntrace = "t.csv"\n')
    monkeypatch.chdir(tmp_path)
    job = Job(config=tmp_path / "job" / "job.toml", quiet=True)
    assert job.config["data"]["path"] == f"{tmp_path / 'job' / 'corpus'}:/abs/other"
    assert job.config["compute"]["trace"] == str(tmp_path / "job" / "t.csv")
    given = Job(options={"data.path": "here"}, quiet=True)  # the working directory's
    assert given.config["data"]["path"] == str(tmp_path / "here")


@pytest.mark.parametrize("settings,key", [
    ({"strategy.name": "diloco", "strategy.period": 500}, "strategy.period = 500"),  # H
    ({"strategy.name": "localsgd", "strategy.period": 3}, "strategy.period = 3"),
    ({"compression.name": "dgc", "compression.warmup_steps": 5}, "compression.warmup_steps = 5")])
def test_a_step_count_that_reaches_the_runs_end_is_named_at_the_start(settings, key, tmp_path,
                                                                        capfd):
    Job(options={**SMALL, **settings, "run.out": str(tmp_path / "run")}, quiet=True).simulate()
    said = [line for line in capfd.readouterr().err.splitlines() if "not below" in line]
    assert len(said) == 1 and said[0].startswith(f"fastsgd: {key} is not below the run's 3 "
                                                 "steps (")
    assert said[0].endswith("): what it paces happens only at the end or not at all; set it "
                            "below 3, or train longer")


@pytest.mark.parametrize("settings", [{"strategy.name": "localsgd", "strategy.period": 2},
                                      {"strategy.name": "diloco"},  # 0: scaled to the run
                                      {"strategy.name": "async_diloco"}])
def test_a_step_count_within_the_run_says_nothing(settings, tmp_path, capfd):
    Job(options={**SMALL, **settings, "run.out": str(tmp_path / "run")},
        quiet=True).simulate()
    assert "not below" not in capfd.readouterr().err
