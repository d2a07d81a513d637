"""TensorBoard event files of a run, written from its metrics.jsonl and eval.jsonl while it
runs (every few seconds, by the worker that evaluates) and when it ends: per-rank scalars
(loss, learning rate, gradient norm where clipped, bytes sent and received, staleness) and
the representative model's evaluations (accuracy, loss, perplexity, bits per byte for
byte-level text, consensus distance).

One file per run, in the run directory itself, so `tensorboard --logdir runs` shows one run
per job (named by its folder), each rank a tag (`loss/rank3`). The event time is the run's
own clock: the virtual clock in simulation, seconds since the start on real processes
(offset by the run's start, so TensorBoard's "relative" axis reads the training time).

Written here without TensorBoard or TensorFlow: an event file is a TFRecord stream of
`Event` protocol buffers (tensorflow/core/util/event.proto), each record framed by its
length and masked CRC-32C checksums (tensorflow/core/lib/io/record_writer.cc). Only the
reader needs `pip install fastsgd[tensorboard]`."""

from __future__ import annotations

import json
import math
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

FLOAT_MAX = 3.4028234663852886e38
PREFIX = "events.out.tfevents."
SUFFIX = ".fastsgd"  # ours: replaced when the run is written again (a resumed run)
LIVE_EVERY = 5.0  # s between updates of a running run's event file (TensorBoard reloads every 5)
PER_RANK = ("loss", "lr", "grad_norm", "bytes_sent", "bytes_received", "staleness")
PER_EVAL = {"accuracy": "accuracy", "loss": "eval_loss", "perplexity": "perplexity",
            "bits_per_byte": "bits_per_byte",  # byte-level text only
            "consensus_distance": "consensus"}


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord checksums it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord: length, its checksum, the data, its checksum."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", _masked(crc32c(length))) + data
            + struct.pack("<I", _masked(crc32c(data))))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int = 0, tag: str | None = None, value: float = 0.0,
          version: str | None = None) -> bytes:
    """An Event: wall_time (1, double), step (2, int64), file_version (3) or a summary (5)
    of one scalar Value: tag (1), simple_value (2, float)."""
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if version is not None:
        return out + _field(3, version.encode())
    if math.isfinite(value) and abs(value) > FLOAT_MAX:  # beyond float32: infinite
        value = math.copysign(math.inf, value)
    scalar = _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value)
    return out + _field(5, _field(1, scalar))


class EventFile:
    """A run's event file, kept up to date: each `update` appends what metrics.jsonl and
    eval.jsonl gained since the last one (whole lines only), so TensorBoard, which reads on
    from where it stopped, shows the run live. The first replaces the file written before (a
    resumed run's), and so does any update that finds the file not as it left it (another
    worker wrote it while it led the run). `start` is the epoch time the run's clock counts
    from."""

    def __init__(self, run_dir: str | Path, start: float):
        self.run_dir, self.start = Path(run_dir), start
        self.path: Path | None = None
        self._read = {"metrics.jsonl": 0, "eval.jsonl": 0}  # bytes taken in of each
        self._left: tuple[int, int, int] | None = None  # the file as the last update left it
        self._lock = threading.Lock()  # one update at a time: the live one runs in a thread
        self._live: threading.Thread | None = None

    def update_soon(self) -> None:
        """Update in a thread of its own (the training thread goes on), unless one still runs;
        a live view: what fails here is done again by the next update."""
        if self._live is None or not self._live.is_alive():
            self._live = threading.Thread(target=self._try_update, daemon=True,
                                          name="fastsgd-tensorboard")
            self._live.start()

    def _try_update(self) -> None:
        try:
            self.update()
        except (OSError, ValueError):
            pass

    def update(self) -> Path:
        with self._lock:
            return self._update()

    def _update(self) -> Path:
        records = []
        if self.path is not None and self._left != _identity(self.path):
            self.path, self._read = None, dict.fromkeys(self._read, 0)  # start over
        if self.path is None:
            for old in self.run_dir.glob(f"{PREFIX}*{SUFFIX}"):
                old.unlink()
            self.path = self.run_dir / f"{PREFIX}{int(self.start)}.{socket.gethostname()}{SUFFIX}"
            records.append(event(self.start, version="brain.Event:2"))
        for row in self._new_rows("metrics.jsonl"):
            at, rank = self.start + row["time"], row["rank"]
            records += [event(at, row["step"], f"{key}/rank{rank}", float(row[key]))
                        for key in PER_RANK if row.get(key) is not None]
        for row in self._new_rows("eval.jsonl"):
            records += [event(self.start + row["time"], row["step"], tag, float(row[key]))
                        for key, tag in PER_EVAL.items() if row.get(key) is not None]
        with open(self.path, "ab") as f:
            f.write(b"".join(map(record, records)))
        self._left = _identity(self.path)
        return self.path

    def _new_rows(self, name: str) -> list[dict]:
        try:
            with open(self.run_dir / name, "rb") as f:
                f.seek(self._read[name])
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[:data.rfind(b"\n") + 1]  # a line being written waits for the next update
        self._read[name] += len(whole)
        return [row for line in whole.splitlines() if (row := _decoded(line)) is not None]


class LiveEvents:
    """run.tensorboard: every LIVE_EVERY seconds the run's leader brings its event file up to
    date (off the training thread), so that TensorBoard shows the run while it trains; a
    worker that leads again later starts the file over."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.run_dir, self.enabled = run_dir, enabled
        self._file: EventFile | None = None
        self._next = 0.0  # time.perf_counter() of the next look

    def look(self, leads: bool, wall: float, flush: Callable[[], None] | None) -> None:
        """After a step: `leads` the run now, `wall` seconds trained; `flush` the metrics
        first (on real processes)."""
        if not self.enabled or time.perf_counter() < self._next:
            return
        self._next = time.perf_counter() + LIVE_EVERY
        if not leads:
            self._file = None
            return
        if flush is not None:
            flush()
        self.file(wall).update_soon()

    def file(self, wall: float) -> EventFile:
        """The event file of a run that has trained `wall` seconds."""
        if self._file is None:
            self._file = EventFile(self.run_dir, time.time() - wall)
        return self._file


def _decoded(line: bytes) -> dict | None:
    """A line of a JSON Lines file; None for a blank or torn one (a write cut short)."""
    try:
        return json.loads(line) if line.strip() else None
    except ValueError:
        return None


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def write_events(run_dir: str | Path, start: float) -> Path:
    """Write RUN_DIR's event file in one go (replacing the one written before); `start` is
    the epoch time the run's clock counts from. Returns the file."""
    return EventFile(run_dir, start).update()
