"""A checkpoint's manifest damaged by hand or by the disk: read as unreadable (one line, once
per node, then the checkpoint before it), never a traceback."""

import json
from pathlib import Path

import pytest
import torch

from fastsgd.errors import UserError
from fastsgd.records import checkpoint, manifest
from fastsgd.transport.sim import simulate

GOOD = "ab" * 32


def _write(run_dir: Path, step: int, workers: int, value: float) -> None:
    digests = [checkpoint.save_worker(run_dir, step, r, {"x": torch.full((3,), value)}).hex()
               for r in range(workers)]
    checkpoint.commit(run_dir, step, digests, keep=5)


def _agree(run_dir: Path, workers: int) -> list[tuple[int, float]]:
    def worker(t):
        step, data = checkpoint.agree_step(run_dir, t)
        return step, float(checkpoint.load(data)["x"][0])
    return simulate(workers, worker)


def _manifest_of(run_dir: Path, step: int) -> Path:
    return checkpoint.step_dir(run_dir, step) / manifest.NAME


DAMAGED = {  # what the newest manifest holds instead: what the line says
    "a list": ([], "manifest.json holds a list, not an object"),
    "null": (None, "manifest.json holds a NoneType, not an object"),
    "no keys": ({}, "its step is None, not 20"),
    "another step": ({"step": 10}, "its step is 10, not 20"),
    "workers a string": ({"workers": "2"}, "its workers is '2', not a number of workers"),
    "workers true": ({"workers": True}, "its workers is True"),
    "no workers": ({"workers": 0, "sha256": []}, "its workers is 0"),
    "sha256 short": ({"sha256": [GOOD]}, "its sha256 is not a list of 2 digests"),
    "sha256 long": ({"sha256": [GOOD] * 3}, "its sha256 is not a list of 2 digests"),
    "sha256 a dict": ({"sha256": {"0": GOOD}}, "its sha256 is not a list of 2 digests"),
    "sha256 all null": ({"sha256": [None, None]}, "its sha256 names no worker's file"),
    "sha256 a number": ({"sha256": [GOOD, 5]}, "its sha256 of worker 1 is 5, not a SHA-256"),
    "sha256 not hex": ({"sha256": ["zz" * 32, GOOD]}, "its sha256 of worker 0 is 'zzzz"),
}


@pytest.mark.parametrize("damage", DAMAGED, ids=list(DAMAGED))
def test_a_malformed_manifest_is_unreadable_and_said_once(tmp_path, capsys, damage):
    _write(tmp_path, 10, 2, 1.0)
    _write(tmp_path, 20, 2, 2.0)
    change, said = DAMAGED[damage]
    path = _manifest_of(tmp_path, 20)
    if isinstance(change, dict) and change:  # these keys changed; {}: the manifest is {}
        change = {**json.loads(path.read_text()), **change}
    path.write_text(json.dumps(change))
    assert _agree(tmp_path, 2) == [(10, 1.0), (10, 1.0)]
    err = capsys.readouterr().err
    assert err.count("is unreadable") == 1, err  # once, not once per worker
    assert f"step-00000020 is unreadable ({said}" in err and "using an earlier one" in err


@pytest.mark.parametrize("data", [b"{", b"\xff\xfe", b""])
def test_a_manifest_that_is_not_json_is_unreadable_and_said_once(tmp_path, capsys, data):
    _write(tmp_path, 10, 2, 1.0)
    _write(tmp_path, 20, 2, 2.0)
    _manifest_of(tmp_path, 20).write_bytes(data)
    assert _agree(tmp_path, 2) == [(10, 1.0), (10, 1.0)]
    assert capsys.readouterr().err.count("step-00000020 is unreadable") == 1


def test_a_damaged_manifest_only_another_worker_read_is_said_too(tmp_path, capsys):
    """Worker 1 alone reads step 20's manifest (its file of step 30 is corrupt): the line
    is still said, once."""
    for step in (10, 20, 30):
        _write(tmp_path, step, 2, step)
    _manifest_of(tmp_path, 20).write_text("[]")
    checkpoint.rank_file(tmp_path, 30, 1).write_bytes(b"x")
    assert _agree(tmp_path, 2) == [(10, 10.0), (10, 10.0)]
    err = capsys.readouterr().err
    assert err.count("step-00000020 is unreadable (manifest.json holds a list") == 1, err
    assert err.count("step-00000030/rank-00001.pt does not match its checksum") == 1, err


def test_a_lost_workers_empty_digest_still_reads_the_lowest_survivors(tmp_path, capsys):
    _write(tmp_path, 10, 2, 1.0)
    checkpoint.commit(tmp_path, 20, [checkpoint.save_worker(
        tmp_path, 20, 0, {"x": torch.full((3,), 2.0)}).hex()], keep=5, members=[0], workers=2)
    assert _agree(tmp_path, 2) == [(20, 2.0), (20, 2.0)]
    assert capsys.readouterr().err == ""


def test_a_missing_workers_file_names_the_file(tmp_path, capsys):
    _write(tmp_path, 10, 2, 1.0)
    _write(tmp_path, 20, 2, 2.0)
    checkpoint.rank_file(tmp_path, 20, 1).unlink()
    assert _agree(tmp_path, 2) == [(10, 1.0), (10, 1.0)]
    assert "step-00000020/rank-00001.pt is unreadable (No such file" in capsys.readouterr().err


def test_every_checkpoint_damaged_says_so_not_that_there_is_none(tmp_path):
    _write(tmp_path, 10, 2, 1.0)
    _write(tmp_path, 20, 2, 2.0)
    _manifest_of(tmp_path, 20).write_text("[]")
    checkpoint.rank_file(tmp_path, 10, 1).write_bytes(b"x")
    with pytest.raises(UserError, match=r"no complete checkpoint in .* for all 2 workers: "
                       r"every checkpoint there \(step 10, step 20\) is damaged or "
                       r"unreadable$") as caught:
        _agree(tmp_path, 2)
    assert "checkpoint_every" not in str(caught.value)


def test_workers_of_passes_over_a_malformed_manifest(tmp_path):
    _write(tmp_path, 10, 3, 1.0)
    _write(tmp_path, 20, 2, 2.0)
    _manifest_of(tmp_path, 20).write_text(json.dumps({"workers": [2]}))
    assert checkpoint.workers_of(tmp_path) == 3
    with pytest.raises(UserError, match=r"checkpoints are of 3 workers but run.workers = 2"):
        _agree(tmp_path, 2)
