"""The run's own files under a full disk: the final files are whole or absent (written
aside, synced, renamed), a log keeps only whole lines, and the run ends in one line naming
the file."""

import errno
import json
import os
import shutil
import subprocess

import pytest

from fastsgd.errors import UserError
from fastsgd.records.metrics import JsonLines, write_atomically, write_json


def test_a_final_file_that_cannot_be_written_leaves_the_old_one_whole(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"steps": 1})

    def full(f):
        f.write(b"{\"steps\": 2")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(UserError, match=rf"^cannot write {path}: No space left on device; "):
        write_atomically(path, full)
    assert json.loads(path.read_text()) == {"steps": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


@pytest.fixture
def small_disk(tmp_path):
    """A 64 kB tmpfs (root, mount); skipped where it cannot be made."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not shutil.which("mount") or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
            capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_log_on_a_full_disk_keeps_whole_lines_and_ends_in_one_line(small_disk):
    log = JsonLines(small_disk / "metrics.jsonl", flush_every=100)
    with pytest.raises(UserError, match=r"^cannot write .*metrics.jsonl: No space left"):
        for step in range(100000):
            log.write({"step": step, "loss": 1.0 / (step + 1), "pad": "x" * 100})
    lines = (small_disk / "metrics.jsonl").read_text().splitlines()
    assert lines and [json.loads(line)["step"] for line in lines] == list(range(len(lines)))
    with pytest.raises(UserError, match=r"^cannot write .*model.pt: No space left"):
        write_atomically(small_disk / "model.pt", lambda f: f.write(b"\0" * 100_000))
    assert not (small_disk / "model.pt").exists() and not (small_disk / "model.pt.tmp").exists()
