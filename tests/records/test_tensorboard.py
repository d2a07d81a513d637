"""TensorBoard event files (tensorboard.py): written without TensorBoard, read by it."""

import struct

import pytest

import fastsgd as fs
from fastsgd.records import tensorboard
from fastsgd.records.tensorboard import PREFIX, EventFile, crc32c, record

COMMON = {"data.name": "digits", "model.name": "mlp", "run.steps": 30, "run.eval_every": 10,
          "compute.model": "fixed", "compute.step_time": "2ms", "run.workers": 3}


def test_crc32c_and_the_record_frame():
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    framed = record(b"abc")
    (length,) = struct.unpack("<Q", framed[:8])
    assert length == 3 and framed[12:15] == b"abc" and len(framed) == 8 + 4 + 3 + 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for strategy in ("allreduce", "dpsgd"):
        fs.Job(strategy=strategy, options={**COMMON, "run.out": str(root / strategy)},
               quiet=True).simulate()
    return root


def test_one_event_file_per_run_and_none_when_off(runs, tmp_path):
    assert len(list((runs / "dpsgd").glob(PREFIX + "*"))) == 1
    fs.Job(options={**COMMON, "run.out": str(tmp_path / "r"),
                                 "run.tensorboard": False}, quiet=True).simulate()
    assert not list((tmp_path / "r").glob(PREFIX + "*"))


def test_tensorboard_reads_one_run_per_job_with_a_tag_per_rank(runs):
    multiplexer = pytest.importorskip(
        "tensorboard.backend.event_processing.event_multiplexer",
        reason="tensorboard is not installed (pip install fastsgd[tensorboard]; .ci/run does)")
    mux = multiplexer.EventMultiplexer().AddRunsFromDirectory(str(runs))
    mux.Reload()
    assert sorted(mux.Runs()) == ["allreduce", "dpsgd"]
    run = fs.Result(None, runs / "dpsgd")
    tags = set(mux.Runs()["dpsgd"]["scalars"])
    assert {f"loss/rank{r}" for r in range(3)} <= tags
    assert {"accuracy", "eval_loss", "consensus", "bytes_sent/rank2", "lr/rank1"} <= tags
    losses = [(e.step, e.value) for e in mux.Scalars("dpsgd", "loss/rank1")]
    rows = sorted((m["step"], m["loss"]) for m in run.metrics() if m["rank"] == 1)
    assert losses == [(s, pytest.approx(v)) for s, v in rows]
    # the event time is the virtual clock (offset by the run's start)
    evals = run.evals()
    accuracy = mux.Scalars("dpsgd", "accuracy")
    assert [e.step for e in accuracy] == [e["step"] for e in evals]
    assert (accuracy[-1].wall_time - accuracy[0].wall_time
            == pytest.approx(evals[-1]["time"] - evals[0]["time"], abs=1e-6))


def _records(path):
    data, records = path.read_bytes(), []
    while data:
        (length,) = struct.unpack("<Q", data[:8])
        records.append(data[12:12 + length])
        data = data[12 + length + 4:]
    return records


def test_a_running_runs_event_file_grows_by_whole_lines(tmp_path):
    metrics, evals = tmp_path / "metrics.jsonl", tmp_path / "eval.jsonl"
    line = '{"step": %d, "rank": 0, "time": 0.5, "loss": 2.0, "bytes_sent": 8}\n'
    metrics.write_text(line % 1 + (line % 2)[:20])  # the second line is being written
    live = EventFile(tmp_path, start=1000.0)
    path = live.update()
    assert len(_records(path)) == 1 + 2  # the version, then step 1's loss and bytes
    with metrics.open("a") as f:
        f.write((line % 2)[20:])
    evals.write_text('{"step": 2, "time": 0.9, "accuracy": 0.5, "loss": 1.0}\n')
    live.update()
    assert len(_records(path)) == 1 + 4 + 2
    assert live.update() == path and len(_records(path)) == 7  # nothing new: nothing added


def test_the_event_file_is_kept_up_to_date_while_the_run_trains(monkeypatch, tmp_path):
    multiplexer = pytest.importorskip(
        "tensorboard.backend.event_processing.event_multiplexer",
        reason="tensorboard is not installed (pip install fastsgd[tensorboard]; .ci/run does)")
    updates = []
    update = EventFile.update
    monkeypatch.setattr(tensorboard, "LIVE_EVERY", 0.0)  # after every step
    monkeypatch.setattr(EventFile, "update", lambda self: updates.append(1) or update(self))
    out = tmp_path / "live"
    fs.Job(options={**COMMON, "run.out": str(out)}, quiet=True).simulate()
    assert len(updates) > 10
    mux = multiplexer.EventMultiplexer().AddRunsFromDirectory(str(tmp_path))
    mux.Reload()
    run = fs.Result(None, out)
    for rank in range(3):
        losses = [(e.step, e.value) for e in mux.Scalars("live", f"loss/rank{rank}")]
        rows = sorted((m["step"], m["loss"]) for m in run.metrics() if m["rank"] == rank)
        assert losses == [(s, pytest.approx(v)) for s, v in rows]  # each once, all of them
    assert [e.step for e in mux.Scalars("live", "accuracy")] == [10, 20, 30]


def test_an_event_file_that_another_worker_wrote_meanwhile_is_started_over(tmp_path):
    # the worker that evaluates was lost, another led the run for a while, and it is back
    line = '{"step": %d, "rank": 0, "time": 0.5, "loss": 2.0, "bytes_sent": 8}\n'
    (tmp_path / "metrics.jsonl").write_text(line % 1 + '{"step": 2, "ra\n')  # a torn line
    first = EventFile(tmp_path, start=1000.0)
    path = first.update()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(line % 3)
    EventFile(tmp_path, start=1000.0).update()  # the other leader's: the whole file again
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(line % 4)
    assert first.update() == path
    assert len(_records(path)) == 1 + 3 * 2  # once each: steps 1, 3 and 4
