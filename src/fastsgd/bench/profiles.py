"""One profile of compute per workload: simulated cells under `compute.model = "profile"`
(the default) that run the same job, strategy and codec aside (the model, data, batch,
run.accumulate, run.precision and optimizer: fingerprint.workload), are charged the same
forward, backward, update and reduce_bandwidth, as docs/simulator.md promises strategies
and codecs are compared (each profiling on its own, two cells' forward had come out 24%
apart).

The first cell of a workload to run measures them, as any run does, into its config.toml;
the others run after it, given its times and what they were measured for (compute.profiled),
and so measure only their own strategy's round and codec (profiling.profiled), whichever node runs
them. A cell done before (a bench run again, with a longer axis) is such a first cell. The
cell's own check stays: where its fingerprint is not the times' after all, it profiles again,
in one line naming the key. A cell's id is its spec's configuration, without these times."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastsgd.bench.spec import Cell
from fastsgd.config import schema as cfg
from fastsgd.loop.fingerprint import workload
from fastsgd.loop.profiling import KEYS


def workload_of(cell: Cell) -> str | None:
    """The workload whose profile `cell` charges, as a key; None for a cell that profiles
    nothing: real processes, fixed or measured compute, or times its spec gives."""
    compute = cell.config["compute"]
    if cell.mode != "simulate" or compute["model"] != "profile" or any(compute[k] for k in KEYS):
        return None
    return json.dumps(workload(cell.config), sort_keys=True, default=str)


class Profiles:
    """The profiling cells of a bench's matrix by workload; `folder(cell)` is a cell's run
    directory, `done(cell)` whether it finished."""

    def __init__(self, matrix: list[Cell], folder: Callable[[Cell], Path],
                 done: Callable[[Cell], bool]):
        self.folder, self.done = folder, done
        self.groups: dict[str, list[Cell]] = {}
        for cell in matrix:
            key = workload_of(cell)
            if key is not None:
                self.groups.setdefault(key, []).append(cell)

    def given(self, todo: list[Cell]) -> list[Cell]:
        """The cells of `todo` to run after another of their workload, whose times they
        are given: all but the first where none of it is done yet."""
        ids = {c.id for c in todo}
        later: list[Cell] = []
        for group in self.groups.values():
            waiting = [c for c in group if c.id in ids]
            later += waiting if len(waiting) < len(group) else waiting[1:]
        return later

    def times(self, cell: Cell) -> dict[str, Any]:
        """The [compute] keys a done cell of `cell`'s workload measured (and what for), read
        from its config.toml; none where none is done (then `cell` measures them)."""
        for other in self.groups.get(workload_of(cell) or "", []):
            path = self.folder(other) / "config.toml"
            if other.id == cell.id or not self.done(other) or not path.is_file():
                continue
            compute = cfg.read_toml(path).get("compute", {})
            if compute.get("profiled") and all(compute.get(k) for k in KEYS):
                return {k: compute[k] for k in KEYS}
        return {}


def with_times(cell: Cell, times: dict[str, Any]) -> dict[str, Any]:
    """The configuration `cell` runs: its own, with the times another cell measured."""
    if not times:
        return cell.config
    return {**cell.config, "compute": {**cell.config["compute"], **times}}
