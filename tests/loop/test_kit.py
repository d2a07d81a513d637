"""The practitioner's kit in the loop (worker.py): gradient accumulation, clipping by global
norm, learning-rate schedules, bf16 autocast, AdamW. Synchronous all-reduce with all of it
still equals one process with the global batch; a resume mid-schedule is bitwise."""

import os
import re
import subprocess
import sys

import pytest
import torch

import fastsgd as fs
from fastsgd.errors import UserError
from fastsgd.loop.kit.optimizers import optimizer_from_config
from fastsgd.loop.kit.schedule import factor
from fastsgd.records import checkpoint
from tests.conftest import max_abs_diff

BASE = {"data.name": "digits", "model.name": "mlp", "run.steps": 12, "run.eval_every": 0,
        "data.batch_size": 8, "run.tensorboard": False, "compute.model": "fixed",
        "compute.step_time": "1ms"}
CLIP = {"optimizer.clip_norm": 0.5}
SCHEDULE = {"optimizer.schedule": "cosine", "optimizer.warmup": 3, "optimizer.min_lr": 0.005}
ACCUMULATE = {"run.accumulate": 2}
KITS = {"clip": CLIP, "schedule": SCHEDULE, "accumulate": ACCUMULATE,
        "all": {**CLIP, **SCHEDULE, **ACCUMULATE}}


def params(result) -> dict:
    return torch.load(result.run_dir / "model.pt", weights_only=True)


def job(out, **options) -> fs.Job:
    return fs.Job(options={**BASE, "run.out": str(out), **options}, quiet=True)


def one_process(out, kit: dict) -> fs.Job:
    """One worker with the global batch of 4 workers (their micro-batches all in one)."""
    global_batch = 4 * BASE["data.batch_size"] * kit.get("run.accumulate", 1)
    return job(out, **{**kit, "run.accumulate": 1, "run.workers": 1,
                       "data.batch_size": global_batch})


@pytest.mark.parametrize("kit", KITS)
def test_simulated_allreduce_with_the_kit_equals_one_process(kit, tmp_path):
    options = KITS[kit]
    reference = params(one_process(tmp_path / "one", options).simulate())
    four = params(job(tmp_path / "four", **options, **{"run.workers": 4}).simulate())
    assert max_abs_diff(four, reference) < 1e-5
    if kit != "accumulate":  # and it did something: without it, one process ends elsewhere
        batch_only = {k: v for k, v in options.items() if k == "run.accumulate"}
        plain = params(one_process(tmp_path / "plain", batch_only).simulate())
        assert max_abs_diff(plain, reference) > 1e-3


def test_accumulation_sends_once_a_step(tmp_path):
    """Two micro-batches, one exchange: as many bytes as without accumulation."""
    once = job(tmp_path / "a", **{"run.workers": 4, "run.steps": 3}).simulate()
    twice = job(tmp_path / "b", **{"run.workers": 4, "run.steps": 3, **ACCUMULATE}).simulate()
    assert once.summary["bytes_sent_total"] == twice.summary["bytes_sent_total"] > 0
    # a step takes both micro-batches: twice the samples (8 each), in the figures too
    assert (once.summary["global_batch"], twice.summary["global_batch"]) == (32, 64)
    assert twice.summary["epochs"] == 2 * once.summary["epochs"]


class Linear(torch.nn.Module):
    """No len(), as most models (a Sequential has one)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.layer(x.flatten(1))


def test_a_compiled_model_trains_and_is_saved(tmp_path):
    """torch.compile's wrapper refuses len(), so bool() on it: the end must not ask."""
    result = fs.Job(model=torch.compile(Linear(), backend="eager"), quiet=True,
                    options={**BASE, "run.steps": 2, "run.out": str(tmp_path)}).simulate(2)
    assert result.summary["steps"] == 2 and (tmp_path / "model.pt").is_file()


@pytest.mark.multiproc
def test_real_allreduce_with_the_kit_equals_one_process(tmp_path):
    options = KITS["all"]
    reference = params(one_process(tmp_path / "one", options).simulate())
    real = job(tmp_path / "real", **options, **{"run.workers": 4}).run()
    assert real.summary["mode"] == "real"
    assert max_abs_diff(params(real), reference) < 1e-5


@pytest.mark.multiproc
def test_ddp_accumulates_with_its_no_sync(tmp_path):
    """torch's DDP reduces in backward: the micro-batches before the last run in no_sync."""
    options = {**ACCUMULATE, "run.steps": 6}
    reference = params(one_process(tmp_path / "one", options).simulate())
    real = job(tmp_path / "ddp", **options, **{"run.workers": 4, "strategy.name": "ddp"}).run()
    assert max_abs_diff(params(real), reference) < 1e-5


RESUMED = {**KITS["all"], "run.precision": "bf16", "run.workers": 2, "run.steps": 20,
           "run.checkpoint_every": 10, "optimizer.warmup": 6, "strategy.period": 4}


class Killed(BaseException):  # as kill -9: no `except Exception` takes it
    """Stands for the kill -9 that FASTSGD_TEST_KILL_AFTER_CHECKPOINT sends, in-process."""


@pytest.mark.parametrize("strategy", ["allreduce", "diloco"])
def test_a_simulated_resume_mid_schedule_is_bitwise(strategy, tmp_path, monkeypatch):
    options = {**RESUMED, "strategy.name": strategy}
    if strategy != "diloco":
        del options["strategy.period"]
    straight = job(tmp_path / "straight", **options).simulate()

    def kill(pid, sig):
        raise Killed
    monkeypatch.setenv("FASTSGD_TEST_KILL_AFTER_CHECKPOINT", "10")  # step 10 of 20, cosine
    monkeypatch.setattr(os, "kill", kill)
    with pytest.raises(Killed):
        job(tmp_path / "resumed", **options).simulate()
    monkeypatch.undo()
    assert checkpoint.steps(tmp_path / "resumed") == [10]
    fs.Job(resume=tmp_path / "resumed", quiet=True).simulate()
    for name in ("model.pt", "metrics.jsonl"):
        assert (straight.run_dir / name).read_bytes() == \
            (tmp_path / "resumed" / name).read_bytes(), name


def _sets(options: dict) -> list[str]:
    """--set key=value for each option (TOML's true and false)."""
    return [arg for k, v in options.items()
            for arg in ("--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]


def _cli(*args: str, kill: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kill is not None:
        env["FASTSGD_TEST_KILL_AFTER_CHECKPOINT"] = str(kill)
    return subprocess.run([sys.executable, "-m", "fastsgd", *args], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.multiproc
@pytest.mark.parametrize("strategy", ["allreduce", "diloco"])
def test_real_processes_resume_mid_schedule_bitwise(strategy, tmp_path):
    options = {**BASE, **RESUMED, "strategy.name": strategy}
    if strategy != "diloco":
        del options["strategy.period"]
    common = [*_sets(options), "--quiet", "--no-report"]
    straight = _cli("run", *common, "--set", f"run.out={tmp_path / 'a'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _cli("run", *common, "--set", f"run.out={tmp_path / 'b'}", "--set",
                  "run.on_failure=stop", kill=10)
    assert killed.returncode == 1, killed.stderr[-3000:]
    resumed = _cli("run", "--resume", str(tmp_path / "b"), "--quiet", "--no-report")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _losses(result) -> list[float]:
    return [m["loss"] for m in result.metrics() if m["rank"] == 0]


def test_bf16_trains_under_autocast(tmp_path):
    options = {"run.workers": 2, "run.steps": 30, "optimizer.lr": 0.1}
    bf16 = job(tmp_path / "bf16", **options, **{"run.precision": "bf16"}).simulate()
    losses = _losses(bf16)
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert all(v.dtype == torch.float32 for v in params(bf16).values())  # fp32 weights
    fp32 = job(tmp_path / "fp32", **options).simulate()
    assert _losses(fp32) != losses  # the forward really ran in bf16


@pytest.mark.parametrize("options,key", [({"run.precision": "fp16"}, "run.precision"),
                                         ({"optimizer.warmup": 13}, "optimizer.warmup")])
def test_a_kit_that_cannot_run_is_one_line_naming_the_key(options, key, tmp_path):
    with pytest.raises(UserError, match=f"^{key} = [^\n]*$"):
        job(tmp_path / "run", **options).simulate()


@pytest.mark.parametrize("options,culprit", [
    ({"optimizer.schedule": "cosine", "optimizer.min_lr": 1.0},
     "optimizer.min_lr = 1.0 is above optimizer.lr = "),
    ({"optimizer.name": "adamw", "optimizer.nesterov": True},
     "optimizer.nesterov applies to optimizer.name = 'sgd', not 'adamw'"),
    ({"optimizer.name": "sgd", "optimizer.betas": [0.8, 0.9]},
     "optimizer.betas applies to optimizer.name = 'adam' or 'adamw', not 'sgd'")])
def test_an_optimizer_key_that_would_be_ignored_or_climb_is_one_line(options, culprit,
                                                                     tmp_path):
    with pytest.raises(UserError, match="^" + re.escape(culprit) + "[^\n]*$"):
        job(tmp_path / "run", **options).simulate()


@pytest.mark.parametrize("options,key", [({"run.precision": "fp16"}, "run.precision"),
                                         ({"optimizer.warmup": 13}, "optimizer.warmup")])
def test_a_real_run_refuses_the_kit_before_any_worker_starts(options, key, tmp_path,
                                                             monkeypatch):
    if options.get("run.precision") == "fp16" and torch.cuda.is_available():
        pytest.skip("fp16 runs on this machine's GPU")
    monkeypatch.setattr(fs.job, "launch", lambda *a, **k: pytest.fail("a worker started"))
    with pytest.raises(UserError, match=f"^{key} = [^\n]*$"):
        job(tmp_path / "run", **options, **{"run.workers": 2}).run()


@pytest.mark.multiproc
def test_fp16_on_cpu_ends_a_real_run_in_one_line(tmp_path):
    options = {**BASE, "run.workers": 2, "run.precision": "fp16", "run.out": tmp_path / "run"}
    result = _cli("run", *_sets(options), "--quiet", "--no-report")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.precision = 'fp16' needs a CUDA GPU" in lines[0], lines


def test_adamw_decouples_weight_decay_and_takes_betas():
    make = optimizer_from_config({"name": "adamw", "lr": 0.01, "weight_decay": 0.5,
                                  "betas": [0.8, 0.95], "momentum": 0.9, "nesterov": False})
    p = torch.nn.Parameter(torch.ones(1))
    optimizer = make([p])
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.95)
    p.grad = torch.zeros(1)
    optimizer.step()  # no gradient: only the decoupled decay, lr * wd of the weight
    assert float(p.detach()) == pytest.approx(1 - 0.01 * 0.5)


def test_adamw_and_an_imported_optimizer_train_with_the_kit(tmp_path):
    kit = {**CLIP, **SCHEDULE, "run.workers": 2, "run.steps": 20}
    adamw = job(tmp_path / "adamw", **kit, **{"optimizer.name": "adamw",
                                              "optimizer.lr": 0.01}).simulate()
    losses = _losses(adamw)
    assert sum(losses[-5:]) < sum(losses[:5])
    imported = job(tmp_path / "imported", **kit, **{"optimizer.name": "torch.optim:SGD",
                                                    "optimizer.lr": 0.05}).simulate()
    plain = job(tmp_path / "sgd", **kit, **{"optimizer.momentum": 0.0}).simulate()
    assert max_abs_diff(params(imported), params(plain)) < 1e-6  # the same SGD, kit applied


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd"])
def test_a_micro_batch_whose_loss_is_not_finite_skips_the_step(strategy, tmp_path):
    from tests.loop.test_worker import OPTIONS, _with_nan_samples

    result = fs.Job(model="mlp", data=_with_nan_samples(97), strategy=strategy, quiet=True,
                    options={**OPTIONS, **ACCUMULATE, "data.batch_size": 8,
                             "run.out": str(tmp_path)}).simulate()
    bad = [m for m in result.metrics() if m["loss"] != m["loss"]]  # NaN
    assert bad and result.summary["skipped_steps"] == len(bad)
    assert all(torch.isfinite(p).all() for p in params(result).values())
    assert result.accuracy > 0.8


def _adamw(params):
    return torch.optim.AdamW(params, lr=0.01)


def test_the_kit_applies_around_an_optimizer_given_as_a_function(tmp_path):
    """The schedule and clipping are the loop's, whatever makes the optimizer: with a
    function given, optimizer.schedule and optimizer.clip_norm still hold."""
    def run(out, **kit):
        return fs.Job(optimizer=_adamw, quiet=True,
                      options={**BASE, "run.out": str(tmp_path / out), **kit}).simulate(2)
    plain = run("plain")
    kit = run("kit", **{"optimizer.schedule": "cosine", "optimizer.warmup": 3,
                        "optimizer.clip_norm": 1e-6})
    assert kit.summary["final_loss"] != plain.summary["final_loss"]
    recorded = fs.Job(config=str(tmp_path / "kit" / "config.toml")).config["optimizer"]
    assert (recorded["schedule"], recorded["warmup"], recorded["clip_norm"]) == ("cosine", 3,
                                                                                1e-6)


@pytest.mark.parametrize("given, key", [
    ({"optimizer": _adamw}, "optimizer.lr"),
    ({"strategy": "diloco_object"}, "strategy.period"),
])
def test_an_option_that_an_object_given_would_override_is_one_line(given, key, tmp_path):
    from fastsgd.strategies.diloco import DiLoCo

    given = {k: DiLoCo(period=4) if v == "diloco_object" else v for k, v in given.items()}
    with pytest.raises(UserError, match=f"^{key} in options, beside the "):
        fs.Job(**given, options={**BASE, key: 2})


def test_metrics_log_the_scheduled_rate_and_the_norm_before_clipping(tmp_path):
    """metrics.jsonl: each step's learning rate as the schedule set it; with clipping, the
    gradient's norm before it (what a practitioner tunes clip_norm from)."""
    result = job(tmp_path / "kit", **SCHEDULE, **CLIP, **{"run.workers": 2}).simulate()
    rows = [m for m in result.metrics() if m["rank"] == 0]
    section = {"schedule": "cosine", "warmup": 3, "min_lr": 0.005, "lr": 0.05}
    want = [0.05 * factor(m["step"] - 1, 12, section, 0.005 / 0.05) for m in rows]
    assert [m["lr"] for m in rows] == pytest.approx(want, rel=1e-9)
    assert len(set(m["lr"] for m in rows)) > 6  # it moved: warmup, then decay
    assert all(m["grad_norm"] > 0 for m in rows)
    plain = job(tmp_path / "plain", **{"run.workers": 2, "run.steps": 2}).simulate()
    assert all("grad_norm" not in m for m in plain.metrics())
    assert plain.loss == plain.summary["final_loss"] > 0
