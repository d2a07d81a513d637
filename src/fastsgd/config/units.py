"""Bandwidths and times as people write them: '100Mbit', '1GB', '20ms', '50us'."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from fastsgd.errors import ConfigError

_BANDWIDTH_UNITS = {  # bytes per second
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# The simulator counts integer nanoseconds: a time beyond ~31 years (or a message's time on
# a link slower than 1 bit/s) would overflow its conversion, and '1e400s' reads as inf.
MAX_SECONDS = 1e9
MIN_BANDWIDTH = 1 / 8  # bytes/s
# the most a compute factor (compute.slowdown, compute.straggler_factor, a trace's speed
# either way) may change a step's time: their product with the longest time stays finite
MAX_FACTOR = 1e6


def parse_bandwidth(value: str | float, key: str = "network.bandwidth") -> float:
    """'100Mbit', '10Gbit', '1GB' (bytes), '1GB/s' -> bytes per second; a number is bit/s."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bps = float(value) / 8
    else:
        bps = _parse(str(value), _BANDWIDTH_UNITS, key, "e.g. 100Mbit, 10Gbit or 1GB")
    if bps <= 0:
        raise ConfigError(f"{key} must be > 0, got {value!r}")
    if not MIN_BANDWIDTH <= bps < math.inf:  # NaN too
        raise ConfigError(f"{key} must be a finite bandwidth of at least 1bit, got {value!r}")
    return bps


def parse_seconds(value: str | float, key: str = "network.latency") -> float:
    """'20ms', '50us', '0.1s' -> seconds; a number is seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = _parse(str(value), _TIME_UNITS, key, "e.g. 20ms, 50us or 0.1s")
    if seconds < 0:
        raise ConfigError(f"{key} must be >= 0, got {value!r}")
    if not seconds <= MAX_SECONDS:  # NaN and inf too
        raise ConfigError(f"{key} must be a finite time of at most 1e9s (31 years), got {value!r}")
    return seconds


def _bandwidth_scale(unit: str) -> float | None:
    if unit.lower().endswith("bit"):
        return _BANDWIDTH_UNITS.get(unit.lower())
    if unit.endswith("B"):  # bytes need a capital B: '100mb' is ambiguous
        return _BANDWIDTH_UNITS.get(unit.lower())
    return None


def _parse(text: str, units: dict[str, float], key: str, example: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-zA-Z]*)(/s)?\s*", text)
    unit = match.group(2) if match else ""
    scale = _bandwidth_scale(unit) if units is _BANDWIDTH_UNITS else units.get(unit.lower())
    if not match or scale is None:
        raise ConfigError(f"{key}: cannot read {text!r} ({example})")
    return float(match.group(1)) * scale


def format_seconds(value: float) -> str:
    """A time that parse_seconds reads back exactly, in the largest unit that holds it."""
    return _exact(value, ("s", "ms", "us", "ns"), _TIME_UNITS, parse_seconds, "s")


def format_bandwidth(value: float) -> str:
    """A bandwidth (bytes/s) that parse_bandwidth reads back exactly: 1.25e8 -> '1Gbit'."""
    spelled = ("Tbit", "Gbit", "Mbit", "kbit", "bit", "TB", "GB", "MB", "kB", "B")
    return _exact(value, spelled, _BANDWIDTH_UNITS, parse_bandwidth, "B")


def _exact(value: float, spelled: tuple[str, ...], units: dict[str, float],
           parse: Callable[[str], float], base: str) -> str:
    for unit in spelled:
        count = round(value / units[unit.lower()])
        text = f"{count}{unit}"
        try:
            if (value == 0 or count) and parse(text) == value:
                return text
        except (ConfigError, OverflowError):
            pass
    return f"{value!r}{base}"


def format_ns(ns: int) -> str:
    """An exact, readable time: 1500000 -> '1500us', 7 -> '7ns' (parse_seconds reads it)."""
    return f"{ns // 1000}us" if ns % 1000 == 0 else f"{ns}ns"


def time_check(value: str) -> str | None:
    """An Option check: '' or a time >= 0 (and at most MAX_SECONDS)."""
    return _check(parse_seconds, value, "must be a time >= 0 such as 20ms, 50us or 0.1s "
                  "(at most 1e9s)")


def bandwidth_check(value: str) -> str | None:
    """An Option check: '' or a bandwidth > 0 (at least 1 bit/s, finite)."""
    return _check(parse_bandwidth, value, "must be a bandwidth > 0 such as 100Mbit or 1GB "
                  "(at least 1bit)")


def _check(parse, value: str, problem: str) -> str | None:
    try:
        value == "" or parse(value)
    except ConfigError:
        return problem
    return None
