"""The simulated network: each message takes `latency + bytes / bandwidth` on its link."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastsgd.errors import ConfigError

_BANDWIDTH_UNITS = {  # bytes per second
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def parse_bandwidth(value: str | float, key: str = "network.bandwidth") -> float:
    """'100Mbit', '10Gbit', '1GB' (bytes), '1GB/s' -> bytes per second; a number is bit/s."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bps = float(value) / 8
    else:
        bps = _parse(str(value), _BANDWIDTH_UNITS, key, "e.g. 100Mbit, 10Gbit or 1GB")
    if bps <= 0:
        raise ConfigError(f"{key} must be > 0, got {value!r}")
    return bps


def parse_seconds(value: str | float, key: str = "network.latency") -> float:
    """'20ms', '50us', '0.1s' -> seconds; a number is seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = _parse(str(value), _TIME_UNITS, key, "e.g. 20ms, 50us or 0.1s")
    if seconds < 0:
        raise ConfigError(f"{key} must be >= 0, got {value!r}")
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


@dataclass(frozen=True)
class Network:
    """A homogeneous network: every link has the same bandwidth (bytes/s) and latency (s)."""

    bandwidth: float = 10e9 / 8
    latency: float = 50e-6
    jitter: float = 0.0  # each point-to-point message waits up to this much longer (random)
    seed: int = 0  # of the jitter

    @classmethod
    def parse(cls, bandwidth: str | float = "10Gbit", latency: str | float = "50us",
              jitter: str | float = 0.0, seed: int = 0) -> Network:
        return cls(parse_bandwidth(bandwidth), parse_seconds(latency),
                   parse_seconds(jitter, "network.jitter"), seed)

    def message_time(self, size: int) -> float:
        """Seconds for one message of `size` bytes on one link."""
        return self.latency + size / self.bandwidth

    def transfer_time(self, size: int) -> float:
        """Seconds a link is busy serializing `size` bytes (no latency)."""
        return size / self.bandwidth

    def allreduce_time(self, size: int, world_size: int) -> float:
        """Ring all-reduce: 2(n-1) steps of size/n bytes: 2(n-1)/n*S/B + 2(n-1)*latency."""
        n = world_size
        return 0.0 if n == 1 else 2 * (n - 1) * self.message_time(size / n)

    def allgather_time(self, size: int, world_size: int) -> float:
        """Ring all-gather of one `size`-byte tensor per worker: (n-1)*(latency + S/B)."""
        return (world_size - 1) * self.message_time(size)
