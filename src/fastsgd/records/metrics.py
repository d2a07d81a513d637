"""Per-iteration timers and the run directory's JSON Lines files (a stable contract)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

PHASES = ("io", "h2d", "forward", "backward", "aggregation", "update")
BYTES = "text"  # the dataset kind whose tokens are bytes: its loss reads as bits per byte


def loss_metrics(loss: float, kind: str = "images") -> dict[str, float]:
    """What an evaluation's loss (the mean cross-entropy in nats) also says: its perplexity,
    exp(loss), and for byte-level text (dataset kind "text") its bits per byte, loss / ln 2.
    A NaN loss gives NaNs; a loss too large for exp, an infinite perplexity."""
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
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, "".join(self._lines).encode())
        finally:
            os.close(fd)
        self._lines = []


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
