"""Per-iteration timers and the run directory's JSON Lines files (a stable contract)."""

from __future__ import annotations

import errno
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from fastsgd.errors import UserError
from fastsgd.workloads.kinds import REGRESSION, TEXT

PHASES = ("io", "h2d", "forward", "backward", "aggregation", "update")
BYTES = TEXT  # the dataset kind whose tokens are bytes: its loss reads as bits per byte


def loss_metrics(loss: float, kind: str = "images") -> dict[str, float]:
    """What an evaluation's loss (the mean cross-entropy in nats) also says: its perplexity,
    exp(loss), and for byte-level text (dataset kind "text") its bits per byte, loss / ln 2.
    A NaN loss gives NaNs; a loss too large for exp, an infinite perplexity. A regression's
    loss (a mean squared error) says nothing more."""
    if kind == REGRESSION:
        return {}
    try:
        perplexity = math.exp(loss)
    except OverflowError:
        perplexity = math.inf
    out = {"perplexity": perplexity}
    if kind == BYTES:
        out["bits_per_byte"] = loss / math.log(2)
    return out


class JsonLines:
    """Appends JSON objects to a file; each flush is one write() on an O_APPEND descriptor, so
    several processes (or simulated workers) can share the file without interleaving lines.
    Lines are flushed every `flush_every` of them, or by the first write once the oldest is
    `within` seconds old: a worker killed at any moment loses what it wrote in about that
    long (a step's worth more where steps take longer)."""

    def __init__(self, path: Path, flush_every: int = 50, within: float = 1.0):
        self.path = Path(path)
        self.flush_every, self.within = flush_every, within
        self._lines: list[str] = []
        self._since = 0.0  # time.monotonic() of the oldest line not flushed

    def write(self, record: dict[str, Any]) -> None:
        if not self._lines:
            self._since = time.monotonic()
        self._lines.append(json.dumps(record, allow_nan=True) + "\n")
        if (len(self._lines) >= self.flush_every
                or time.monotonic() - self._since >= self.within):
            self.flush()

    def flush(self) -> None:
        if not self._lines:
            return
        data = "".join(self._lines).encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, data)
                if written < len(data):  # a full disk mid-write: no torn line stays
                    os.ftruncate(fd, os.fstat(fd).st_size - written)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            finally:
                os.close(fd)
        except OSError as e:
            raise cannot_write(self.path, e) from None
        self._lines = []


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a file."""
    write_atomically(path, lambda f: f.write((json.dumps(data, indent=2) + "\n").encode()))


FAILURES = "failures.json"  # a run's restarts, kept across its processes (a resume)


def add_failure(run_dir: Path, failure: dict[str, Any]) -> None:
    """Record a restart of the run in RUN_DIR/failures.json, beside those before it."""
    write_json(run_dir / FAILURES, {"failures": [*failures_of(run_dir), failure]})


def failures_of(run_dir: Path) -> list[dict[str, Any]]:
    """Every restart the run went through, in this process and the ones it resumes."""
    path = run_dir / FAILURES
    return json.loads(path.read_text())["failures"] if path.is_file() else []


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """`write` into a temporary file beside `path`, on disk (fsync), then renamed over it: a
    crash or a full disk leaves the old file or none, never a torn one; one line naming
    the file if it cannot be written."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise cannot_write(path, e) from None


def cannot_write(path: Path, error: OSError) -> UserError:
    """A run file that cannot be written (a full disk, a read-only folder), in one line."""
    return UserError(f"cannot write {path}: {error.strerror or error}; the run's "
                     "checkpoints, if any, are kept (fastsgd run --resume)")
