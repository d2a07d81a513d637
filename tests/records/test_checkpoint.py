"""Checkpoints (checkpoint.py): atomic, checksummed, kept; a run resumed from one is the run
that never stopped, bit for bit."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fastsgd as fs
from fastsgd.errors import UserError
from fastsgd.records import checkpoint
from fastsgd.transport.sim import simulate
from tests.conftest import interrupt_once_training, orphans

STRAIGHT = {"run.steps": 40, "run.checkpoint_every": 10, "run.eval_every": 10,
            "run.target_accuracy": 0.5, "compute.model": "fixed", "compute.step_time": "1ms",
            "data.batch_size": 16}
RUN_FILES = ("model.pt", "metrics.jsonl", "eval.jsonl")


class Killed(BaseException):  # as kill -9: no `except Exception` takes it
    """Stands for the kill -9 that FASTSGD_TEST_KILL_AFTER_CHECKPOINT sends, in-process."""


def _write(run_dir: Path, step: int, workers: int, value: float, keep: int = 5) -> None:
    digests = [checkpoint.save_worker(run_dir, step, r, {"x": torch.full((3,), value)}).hex()
               for r in range(workers)]
    checkpoint.commit(run_dir, step, digests, keep)


def _agree(run_dir: Path, workers: int) -> list[tuple[int, float]]:
    def worker(t):
        step, data = checkpoint.agree_step(run_dir, t)
        return step, float(checkpoint.load(data)["x"][0])
    return simulate(workers, worker)


def test_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in (10, 20, 30):
        _write(tmp_path, step, 2, step, keep=2)
    checkpoint.save_worker(tmp_path, 35, 0, {"x": torch.zeros(3)})  # died before its manifest
    _write(tmp_path, 40, 2, 40, keep=2)
    assert checkpoint.steps(tmp_path) == [30, 40]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000030", "step-00000040"]
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_file_falls_back_to_the_previous_checkpoint(tmp_path, capsys, damage):
    _write(tmp_path, 10, 2, 1.0)
    _write(tmp_path, 20, 2, 2.0)
    path = checkpoint.rank_file(tmp_path, 20, 1)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    path.write_bytes(data if damage == "flip" else data[:len(data) // 3])
    assert _agree(tmp_path, 2) == [(10, 1.0), (10, 1.0)]  # rank 0's own file was fine
    err = capsys.readouterr().err
    assert "rank-00001.pt does not match its checksum" in err and "earlier one" in err


def test_no_checkpoint_is_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="no complete checkpoint in .*checkpoint_every"):
        _agree(tmp_path, 2)


def test_a_full_disk_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    _write(tmp_path, 10, 1, 1.0)
    before = checkpoint.rank_file(tmp_path, 10, 0).read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(checkpoint.os, "fsync", full)
    with pytest.raises(UserError, match="cannot write checkpoint .*rank-00000.pt: No space"):
        checkpoint.save_worker(tmp_path, 20, 0, {"x": torch.ones(3)})
    monkeypatch.undo()
    assert checkpoint.rank_file(tmp_path, 10, 0).read_bytes() == before
    assert checkpoint.steps(tmp_path) == [10]
    assert not list(tmp_path.rglob("*.tmp"))


def _job(out: Path, strategy: str, codec: str, **options) -> fs.Job:
    return fs.Job(model="mlp", data="digits", strategy=strategy, compressor=codec, quiet=True,
                  options={**STRAIGHT, "run.workers": 4, "run.out": str(out), **options})


def _same_files(a: Path, b: Path) -> None:
    for name in RUN_FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


# Every strategy, some with codec state. ps, adpsgd and sgp settle first: every message in
# flight is answered and taken in (Replica.settle).
SIMULATED = [("allreduce", "none"), ("allreduce", "powersgd"), ("allreduce", "onebit"),
             ("ps", "none"), ("ps", "qsgd"), ("adpsgd", "none"), ("sgp", "none"), ("sgp", "topk"),
             ("ssp", "none"), ("ssp", "topk"), ("dpsgd", "none"), ("dpsgd", "topk"),
             ("localsgd", "topk"), ("easgd", "none"), ("bmuf", "none"), ("diloco", "none"),
             ("hogwild", "none"), ("ltfb", "none")]


@pytest.mark.parametrize("strategy,codec", SIMULATED)
def test_simulated_resume_is_bitwise(tmp_path, monkeypatch, strategy, codec):
    _job(tmp_path / "straight", strategy, codec).simulate()

    def kill(pid, sig):
        raise Killed
    monkeypatch.setenv("FASTSGD_TEST_KILL_AFTER_CHECKPOINT", "20")
    monkeypatch.setattr(os, "kill", kill)
    with pytest.raises(Killed):
        _job(tmp_path / "resumed", strategy, codec).simulate()
    monkeypatch.undo()
    assert checkpoint.steps(tmp_path / "resumed") == [10, 20]
    fs.Job(resume=tmp_path / "resumed", quiet=True).simulate()
    _same_files(tmp_path / "straight", tmp_path / "resumed")
    assert checkpoint.steps(tmp_path / "resumed") == [30, 40]  # keep_checkpoints = 2


def test_a_strategy_that_cannot_resume_yet_refuses_at_the_start(tmp_path):
    with pytest.raises(UserError, match="strategy.name = 'diloco' with strategy.overlap = 2 "
                                        "cannot be checkpointed yet.*run.checkpoint_every = 0"):
        _job(tmp_path / "run", "diloco", "none", **{"strategy.overlap": 2}).simulate()
    assert not (tmp_path / "run").exists()


class Chatty:
    """A user's strategy that leaves a message in flight at every step, and no settle."""

    name, OPTIONS, CODEC_KINDS = "chatty", {}, ("exact",)

    def init(self, params, ctx):
        ctx.transport.start_messages()
        return {}

    def on_gradients(self, params, state, ctx):
        return None

    def on_parameters(self, params, state, ctx):
        t = ctx.transport
        t.post(torch.zeros(1), (t.rank + 1) % t.world_size, 7)

    def close(self):
        return None


def test_the_simulator_refuses_messages_in_flight_in_one_line(tmp_path):
    with pytest.raises(UserError, match="'tests.records.test_checkpoint:Chatty' has messages in "
                                        "flight at step 10: the simulator cannot checkpoint"):
        _job(tmp_path / "run", Chatty(), "none").simulate()


def test_resume_needs_a_run_directory(tmp_path):
    with pytest.raises(UserError, match="cannot resume .*nowhere: no config.toml"):
        fs.Job(resume=tmp_path / "nowhere")


def _cli(*args: str, kill: int | None = None, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_vars}
    if kill is not None:
        env["FASTSGD_TEST_KILL_AFTER_CHECKPOINT"] = str(kill)
    return subprocess.run([sys.executable, "-m", "fastsgd", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def _records(path: Path) -> int:
    """How many TFRecords an event file holds (each: length, checksum, data, checksum)."""
    data, count, at = path.read_bytes(), 0, 0
    while at < len(data):
        at += 8 + 4 + int.from_bytes(data[at:at + 8], "little") + 4
        count += 1
    assert at == len(data)
    return count


def _losses(run_dir: Path) -> list[tuple]:
    rows = fs.Result(None, run_dir).metrics()
    return sorted((r["step"], r["rank"], r["loss"], r["bytes_sent"]) for r in rows)


# Real processes: 100 steps straight, against 50, every worker killed (-9) right after the
# checkpoint of step 50, and 50 more resumed: the same bits (times aside, which are wall).
@pytest.mark.multiproc
@pytest.mark.parametrize("strategy,codec", [("allreduce", "none"), ("dpsgd", "none"),
                                            ("localsgd", "topk"), ("diloco", "none")])
def test_real_processes_resume_bitwise_after_kill_9(tmp_path, strategy, codec):
    common = ["--set", "data.name=digits", "--set", "model.name=mlp", "--set", "run.workers=2",
              "--set", "run.steps=100", "--set", "run.checkpoint_every=50", "--set",
              f"strategy.name={strategy}", "--set", f"compression.name={codec}", "--quiet",
              "--no-report"]
    straight = _cli("run", *common, "--set", f"run.out={tmp_path / 'a'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _cli("run", *common, "--set", f"run.out={tmp_path / 'b'}", "--set",
                  "run.on_failure=stop", kill=50)
    assert killed.returncode == 1
    assert "killed by signal 9 (SIGKILL)" in killed.stderr
    assert f"fastsgd run --resume {tmp_path / 'b'}" in killed.stderr
    assert "Traceback" not in killed.stderr
    resumed = _cli("run", "--resume", str(tmp_path / "b"), "--quiet", "--no-report")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")
    # the resumed run's TensorBoard events replace the first part's: one file, every step
    events = list((tmp_path / "b").glob("events.out.tfevents.*"))
    evals = len(fs.Result(None, tmp_path / "b").evals())
    # per worker-step: loss, lr, bytes sent and received, staleness (no grad_norm: no clipping)
    assert len(events) == 1 and _records(events[0]) == 1 + 2 * 100 * 5 + 4 * evals


def test_a_complete_run_resumes_only_to_train_longer(tmp_path):
    _job(tmp_path / "run", "allreduce", "none", **{"run.steps": 20}).simulate()
    with pytest.raises(UserError, match="is complete: its checkpoint is at step 20 and the "
                                        "run has 20 steps"):
        fs.Job(resume=tmp_path / "run", quiet=True).simulate()
    longer = fs.Job(resume=tmp_path / "run", quiet=True, options={"run.steps": 30}).simulate()
    assert longer.summary["steps"] == 30
    assert checkpoint.steps(tmp_path / "run") == [20, 30]
    assert [e["step"] for e in longer.evals()] == [10, 20, 30]


# Asynchronous strategies settle before each checkpoint (every push answered and taken in),
# so they resume too; their real runs depend on timing, so this checks that the resumed run
# ends, complete and trained, not its bits.
@pytest.mark.multiproc
@pytest.mark.parametrize("strategy", ["ps", "sgp"])
def test_real_asynchronous_strategies_resume_after_kill_9(tmp_path, strategy):
    common = ["--set", "data.name=digits", "--set", "model.name=mlp", "--set", "run.workers=3",
              "--set", "run.steps=30", "--set", "run.checkpoint_every=10", "--set",
              f"strategy.name={strategy}", "--set", f"run.out={tmp_path / 'run'}", "--quiet",
              "--no-report"]
    assert _cli("run", *common, "--set", "run.on_failure=stop", kill=10).returncode == 1
    resumed = _cli("run", "--resume", str(tmp_path / "run"), "--quiet", "--no-report")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = fs.Result(None, tmp_path / "run").metrics()
    assert sorted({m["step"] for m in summary}) == list(range(1, 31))
    assert checkpoint.steps(tmp_path / "run") == [20, 30]
    evals = fs.Result(None, tmp_path / "run").evals()
    assert evals[-1]["step"] == 30 and evals[-1]["accuracy"] > 0.7


def _ctrl_c(command: str, out: Path, *sets: str, sig: int = signal.SIGINT,
            group: bool = False) -> int:
    """Start `fastsgd COMMAND` for ever, send it `sig` once training has started; check it
    stops within 5 s with exit code 130 and one line saying how to resume; the step."""
    args = [a for item in ("run.steps=100000", f"run.out={out}", *sets) for a in ("--set", item)]
    done = interrupt_once_training([sys.executable, "-m", "fastsgd", command, "--quiet", *args],
                                   out, sig, group)
    err = done.stderr
    assert done.returncode == 130
    step = checkpoint.steps(out)[-1]
    assert err.strip() == (f"fastsgd: interrupted: every worker stopped after step {step} and "
                           f"wrote a checkpoint; resume with: fastsgd {command} --resume {out}")
    resumed = _cli(command, "--resume", str(out), "--quiet", "--set", f"run.steps={step + 20}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == step + 20
    return step


# Ctrl-C (SIGINT to the launching process): every worker stops after the same step within
# 5 s, writes a checkpoint, no process is left, and the run resumes to its end.
@pytest.mark.multiproc
def test_ctrl_c_stops_every_worker_with_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    _ctrl_c("run", out, "data.name=digits", "model.name=mlp", "run.workers=2")
    assert not orphans(str(out))


# What a scheduler or `timeout` (SIGTERM) and a closing terminal (SIGHUP) send, to the whole
# process group: the run stops as on Ctrl-C, with a checkpoint, and no worker is left.
@pytest.mark.multiproc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_every_worker_with_a_checkpoint(sig, tmp_path):
    out = tmp_path / "run"
    _ctrl_c("run", out, "data.name=digits", "model.name=mlp", "run.workers=2", sig=sig,
            group=True)
    assert not orphans(str(out))


# Ctrl-C after a worker was lost and the others shrank: they still stop with a checkpoint,
# and the line says so (it said "the workers had to be killed", counting the lost one).
@pytest.mark.multiproc
def test_ctrl_c_after_a_shrink_stops_the_survivors_with_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    args = [a for item in ("run.steps=100000", f"run.out={out}", "data.name=digits",
                           "model.name=mlp", "run.workers=3", "run.on_failure=shrink")
            for a in ("--set", item)]
    done = interrupt_once_training([sys.executable, "-m", "fastsgd", "run", "--quiet", *args],
                                   out, past_step=40, env={"FASTSGD_TEST_KILL": "2:27"})
    assert done.returncode == 130, done.stderr[-3000:]
    step = checkpoint.steps(out)[-1]
    assert step > 27
    assert done.stderr.strip().splitlines()[-1] == (
        f"fastsgd: interrupted: every worker stopped after step {step} and wrote a "
        f"checkpoint; resume with: fastsgd run --resume {out}")
    assert not orphans(str(out))


# The launcher killed -9: its workers die with it (they would train on unsupervised).
@pytest.mark.multiproc
def test_workers_die_with_a_launcher_killed_by_sigkill(tmp_path):
    out = tmp_path / "run"
    args = [a for item in ("run.steps=100000", f"run.out={out}", "data.name=digits",
                           "model.name=mlp", "run.workers=2") for a in ("--set", item)]
    proc = subprocess.Popen([sys.executable, "-m", "fastsgd", "run", "--quiet", *args],
                            stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while orphans(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not orphans(str(out))


# Ctrl-C on `fastsgd simulate`: the simulated workers stop after the same step and write a
# checkpoint within 5 s, one line says how to resume, and the run resumes to its end.
def test_ctrl_c_stops_a_simulation_with_a_checkpoint(tmp_path):
    _ctrl_c("simulate", tmp_path / "run", "data.name=digits", "model.name=mlp",
            "run.workers=4", "strategy.name=sgp", "compute.model=fixed",
            "compute.step_time=1ms")


def test_cut_back_keeps_what_it_drops_aside_one_folder_per_cut(tmp_path):
    def lines(steps):
        return "".join(json.dumps({"step": s, "rank": r}) + "\n" for s in steps for r in (0, 1))

    (tmp_path / "metrics.jsonl").write_text(lines(range(1, 11)))
    (tmp_path / "eval.jsonl").write_text(lines([5, 10]))
    checkpoint.cut_back(tmp_path, 5)  # a restart from the checkpoint of step 5
    assert (tmp_path / "metrics.jsonl").read_text() == lines(range(1, 6))
    assert (tmp_path / "attempts/1/metrics.jsonl").read_text() == lines(range(6, 11))
    assert (tmp_path / "attempts/1/eval.jsonl").read_text() == lines([10])
    checkpoint.cut_back(tmp_path, 5)  # nothing past it: no folder
    checkpoint.cut_back(tmp_path, 0)  # a restart from the start: the whole attempt aside
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert (tmp_path / "attempts/2/metrics.jsonl").read_text() == lines(range(1, 6))
    assert sorted(p.name for p in (tmp_path / "attempts").iterdir()) == ["1", "2"]


# A crash mid-write leaves a torn last line in a log: a resume drops it (set aside with
# what it cuts); a damaged line before the end is the user's to look at.
@pytest.mark.parametrize("torn", ['{"step": 3, bro', '{"step": 3, broken\n', "garbage",
                                  "\0\0\0\0"])
def test_cut_back_drops_a_torn_last_line(tmp_path, torn):
    whole = "".join(json.dumps({"step": s}) + "\n" for s in (1, 2))
    for name in ("metrics.jsonl", "eval.jsonl"):
        (tmp_path / name).write_text(whole + torn)
    checkpoint.cut_back(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text() == whole
    assert (tmp_path / "eval.jsonl").read_text() == whole
    assert (tmp_path / "attempts/1/metrics.jsonl").read_text() == torn


def test_cut_back_ends_a_whole_last_line_and_refuses_damage_before_it(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}')  # no newline
    checkpoint.cut_back(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    (tmp_path / "eval.jsonl").write_text('{"step": 1}\n{"step": \n{"step": 2}\n')
    with pytest.raises(UserError, match=r"eval.jsonl, line 2, is not a JSON record"):
        checkpoint.cut_back(tmp_path, 2)
