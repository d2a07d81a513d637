"""Which clock a run's times are on: "simulated" (`fastsgd simulate`: virtual seconds of the
network and compute model), "measured" (`fastsgd run`: wall-clock seconds of real processes)
or "unknown". The two are not one unit: a report names the clock of every time it shows,
says so in one line where its runs mix them, and never draws them on one time axis."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

CLOCKS = ("simulated", "measured", "unknown")  # the order of plot panels and of the note
WHAT = {"simulated": "simulated (virtual seconds of the network and compute model)",
        "measured": "measured (wall clock of real processes)",
        "unknown": "on an unknown clock (their summary does not say)"}
AXIS = {"simulated": "training time (s, simulated)",
        "measured": "training time (s, measured wall clock)",
        "unknown": "training time (s, clock unknown)"}


def clock_of(summary: dict[str, Any], environment: dict[str, Any] | None = None) -> str:
    """The clock of a run's times, from its summary's `mode` ("simulated" or "real"); for a
    summary without one, from `simulated_time` (a number only in a simulation), else from
    environment.json's backend ("simulated", or gloo, nccl); "unknown" if none says."""
    mode = summary.get("mode")
    if mode in ("simulated", "real"):
        return "simulated" if mode == "simulated" else "measured"
    if "simulated_time" in summary:
        return "measured" if summary["simulated_time"] is None else "simulated"
    backend = (environment or {}).get("backend")
    if isinstance(backend, str) and backend:
        return "simulated" if backend == "simulated" else "measured"
    return "unknown"


def clock_note(clocks: Iterable[str]) -> str:
    """One line saying that the runs' times are on different clocks, and how many runs are
    on each; "" where they are all on one."""
    counts = Counter(clocks)
    if len(counts) < 2:
        return ""
    parts = [f"{n} {'run' if n == 1 else 'runs'} {WHAT[c]}" for c in CLOCKS if (n := counts[c])]
    return (f"Note: these runs' times are on different clocks: {', '.join(parts)}; compare "
            "times only between runs on the same clock.")
