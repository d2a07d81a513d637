"""A trace file: when each simulated worker is available, how fast it computes, its bandwidth.

CSV, one row per window in which a worker is available (docs/simulator.md):

    # comments and blank lines are skipped
    rank,start,end,speed,bandwidth
    0,0s,,1.0,
    1,0s,20s,0.5,100Mbit
    1,30s,,0.5,1Gbit

`end` empty: available from `start` on, with no end. `speed` divides the modeled compute
time (empty: 1); `bandwidth` is the worker's NIC in that window (empty: the network's). A
worker's windows are in order and do not overlap; outside them it computes nothing (a phase
that would start there waits for the next window; a phase started inside one finishes).
Every rank of the run must have a row, and no row may name a rank the run does not have (as
network.bandwidths).
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from fastsgd.config.units import MAX_FACTOR, parse_bandwidth, parse_seconds
from fastsgd.errors import ConfigError, UserError

COLUMNS = ["rank", "start", "end", "speed", "bandwidth"]
FOREVER = math.inf  # an empty end: however long the run goes


@dataclass(frozen=True)
class Window:
    start: int  # ns
    end: int | float  # ns, exclusive; FOREVER
    speed: float
    bandwidth: float | None  # bytes/s


@dataclass(frozen=True)
class Trace:
    path: str
    windows: dict[int, tuple[Window, ...]]
    lines: dict[int, int] = field(default_factory=dict, compare=False)  # rank: its first row

    def check(self, world_size: int) -> None:
        missing = [r for r in range(world_size) if r not in self.windows]
        if missing:
            raise ConfigError(f"compute.trace {self.path} names {len(self.windows)} workers but "
                              f"the run has {world_size}: no row for rank {missing[0]}")
        extra = sorted(r for r in self.windows if r >= world_size)
        if extra:
            line = self.lines.get(extra[0])
            where = f"compute.trace {self.path}" + (f", line {line}" if line else "")
            raise ConfigError(f"{where}: rank {extra[0]} does not exist: run.workers = "
                              f"{world_size}, ranks go from 0 to {world_size - 1}")

    def _window(self, rank: int, now_ns: int) -> Window | None:
        windows = self.windows[rank]
        k = bisect.bisect_right(windows, now_ns, key=lambda w: w.start) - 1
        return windows[k] if k >= 0 and now_ns < windows[k].end else None

    def speed(self, rank: int, now_ns: int) -> float:
        window = self._window(rank, now_ns)
        return window.speed if window else 1.0

    def bandwidth(self, rank: int, now_ns: int) -> float | None:
        window = self._window(rank, now_ns)
        return window.bandwidth if window else None

    def available(self, rank: int, now_ns: int) -> int:
        for w in self.windows[rank]:
            if now_ns < w.end:
                return max(now_ns, w.start)
        raise UserError(f"compute.trace {self.path}: worker {rank} has work left at "
                        f"{now_ns / 1e9:.3f} s but no window after it")


def load_trace(path: str) -> Trace:
    """Read and check a trace file; errors name the file and line."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"compute.trace: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"compute.trace {path} is not UTF-8 text (CSV; byte {e.start})"
                          ) from None
    rows = [(n, line) for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]
    if not rows or [c.strip() for c in rows[0][1].split(",")] != COLUMNS:
        raise ConfigError(f"compute.trace {path}: the first line must be the header "
                          f"{','.join(COLUMNS)}")
    windows: dict[int, list[Window]] = {}
    lines: dict[int, int] = {}
    for n, line in rows[1:]:
        rank, window = _row(path, n, line)
        lines.setdefault(rank, n)
        earlier = windows.setdefault(rank, [])
        if earlier and window.start < earlier[-1].end:
            raise ConfigError(f"compute.trace {path}, line {n}: worker {rank}'s windows must "
                              "be in order and not overlap")
        earlier.append(window)
    return Trace(path, {r: tuple(ws) for r, ws in windows.items()}, lines)


def _row(path: str, n: int, line: str) -> tuple[int, Window]:
    where = f"compute.trace {path}, line {n}"
    cells = next(csv.reader([line]))
    if len(cells) != len(COLUMNS):
        raise ConfigError(f"{where}: expected {len(COLUMNS)} columns "
                          f"({','.join(COLUMNS)}), got {len(cells)}")
    rank_text, start, end, speed, bandwidth = (c.strip() for c in cells)
    try:
        rank = int(rank_text)
        speed_value = float(speed) if speed else 1.0
    except ValueError:
        raise ConfigError(f"{where}: rank must be an integer and speed a number, "
                          f"got {rank_text!r}, {speed!r}") from None
    if rank < 0 or not 1 / MAX_FACTOR <= speed_value <= MAX_FACTOR:  # NaN and inf too
        raise ConfigError(f"{where}: rank must be >= 0 and speed a number from "
                          f"{1 / MAX_FACTOR:g} to {MAX_FACTOR:g}")
    begin = round(parse_seconds(start, where + ", start") * 1e9)
    finish = round(parse_seconds(end, where + ", end") * 1e9) if end else FOREVER
    if finish <= begin:
        raise ConfigError(f"{where}: end must come after start")
    nic = parse_bandwidth(bandwidth, where + ", bandwidth") if bandwidth else None
    return rank, Window(begin, finish, speed_value, nic)
