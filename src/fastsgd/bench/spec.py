"""A bench spec: a base configuration and axes; each cell of their product is one run.

    [bench]
    mode = "simulate"                  # or "run": real processes, or "hosts": real processes
                                       # on emulated links (bench/hosts.py); an axis may vary it
    [base]                             # any run configuration, as in a config file
    model.name = "mlp"
    run.steps = 300
    [axes]                             # any key of the run configuration, or "mode"
    "strategy.name" = ["allreduce", "dpsgd"]
    "run.workers" = [4, 16]
    "run.seed" = [1, 2, 3]
    network = [{bandwidth = "1Gbit"}, {bandwidth = "100Mbit", latency = "20ms"}]

An axis named by a section alone takes tables, each merged into that section, for keys that
vary together (a strategy and its topology, a network's bandwidth and latency); a table's
`label` names it in the cell's label instead of its values. An axis of any other name is a
joint axis: its tables hold sections (and "mode"), for settings across sections that vary
together, as a deployment's mode, workers and network.

A cell's id is a hash of its mode and its resolved configuration (where it is written
aside), so a bench that is run again skips the cells it has done, and two specs that
share a cell share its id.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastsgd.config import schema as cfg
from fastsgd.config.objects import is_import_path
from fastsgd.config.options import Option, one_of, unknown_key_message, validate_section
from fastsgd.errors import ConfigError, UserError
from fastsgd.strategies import CHOICES, build_strategy, hook

MODES = ("simulate", "run", "hosts")
BENCH = {"mode": Option(str, "simulate", one_of(MODES), "how every cell runs")}  # [bench]


@dataclass(frozen=True)
class Cell:
    mode: str
    config: dict[str, Any]  # resolved and validated
    values: tuple[tuple[str, Any], ...]  # this cell's value on each axis

    @property
    def id(self) -> str:
        config = copy.deepcopy(self.config)
        config["run"].pop("out", None)
        text = json.dumps({"mode": self.mode, "config": config}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        return _describe([k for k, _ in self.values], tuple(v for _, v in self.values))


def command(mode: str, spec: Path, out: Path) -> list[str]:
    """The process that runs a cell: `fastsgd MODE SPEC` writing its run directory to `out`
    (here, or on a Ray worker); for emulated hosts, bench/hosts.py's launcher."""
    if mode == "hosts":
        return [sys.executable, "-m", "fastsgd.bench.hosts", str(spec), "--out", str(out)]
    return [sys.executable, "-m", "fastsgd", mode, str(spec), "--quiet", "--overwrite",
            "--no-report", "--set", f"run.out={out}"]  # the bench reports on them all


def load_spec(path: str | Path) -> tuple[str, dict[str, Any], dict[str, list[Any]]]:
    """(mode, base configuration, axes) of a spec file, checked."""
    if not Path(path).exists():
        raise ConfigError(f"bench spec not found: {path}")
    spec = cfg.read_toml(Path(path))
    unknown = sorted(set(spec) - {"bench", "base", "axes", "doc"})
    if unknown:
        raise ConfigError(f"{path}: unknown section [{unknown[0]}]; a spec has [bench], "
                          "[base], [axes] and [doc] (free text for experiments/)")
    for section in ("bench", "base", "axes"):
        if not isinstance(spec.get(section, {}), dict):
            raise ConfigError(f"{path}: [{section}] must be a table of key = value")
    try:
        mode = validate_section("bench", spec.get("bench", {}), BENCH)["mode"]
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    base = cfg.tables(spec.get("base", {}), f"{path} [base]")  # before an axis merges into it
    _check_base_keys(base, f"{path} [base]")
    if not base and not spec.get("axes"):
        raise ConfigError(f"{path}: neither [base] nor [axes]: a spec sets what its cells "
                          "run (docs/benchmarks.md)")
    folder = Path(path).resolve().parent  # the files a spec names are beside it
    cfg.paths_from(base, folder)
    axes = spec.get("axes", {})
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"axes.{key}: give a non-empty list of values, e.g. [1, 2]")
        axes[key] = [_paths_beside(key, value, folder) for value in values]
    return mode, base, axes


def _check_base_keys(base: dict[str, Any], where: str) -> None:
    """A key of [base] that no cell could take: named here, not as the first cell's. (The
    strategy's and codec's keys depend on the name an axis may choose: a cell checks them.)"""
    for section, values in base.items():
        schema = cfg.SCHEMA[section]
        unknown = [k for k in values if k not in schema]
        if unknown and section not in cfg.OPEN_SECTIONS:
            raise ConfigError(f"{where}: "
                              f"{unknown_key_message(f'{section}.{unknown[0]}', section, schema)}")


def _paths_beside(key: str, value: Any, folder: Path) -> Any:
    """An axis value's relative data.path or compute.trace, from the spec's `folder`."""
    section, _, name = key.partition(".")
    if name:
        raw = {section: {name: value}}
    elif isinstance(value, dict) and key in cfg.SCHEMA:
        raw = {section: dict(value)}
    elif isinstance(value, dict):  # a joint axis: sections
        raw = {s: dict(v) if isinstance(v, dict) else v for s, v in value.items()}
    else:
        return value
    cfg.paths_from(raw, folder)
    return raw[section][name] if name else raw[section] if key in cfg.SCHEMA else raw


def cells(mode: str, base: dict[str, Any], axes: dict[str, list[Any]]) -> list[Cell]:
    """Every cell of the product of the axes, in the spec's order, each validated (an
    unknown key or a bad value names the axis)."""
    out = []
    keys = list(axes)
    for values in itertools.product(*(axes[k] for k in keys)):
        raw = copy.deepcopy(base)
        cell_mode = mode
        for key, value in zip(keys, values):
            if key == "mode":
                cell_mode = _mode(value)
            elif "." in key or key in cfg.SCHEMA:
                section, _, name = key.partition(".")
                _merge(raw, key, section, {name: value} if name else value)
            else:  # a joint axis: each value sets several sections (and the mode) together
                for section, table in _joint(key, value).items():
                    if section == "mode":
                        cell_mode = _mode(table, key)
                    else:
                        _merge(raw, key, section, table)
        try:  # a cell that cannot run is refused before any runs, not hours into the bench
            config = cfg.validate(raw, CHOICES)
            _check_strategy(config)
            if cell_mode == "hosts":  # imported here: `python -m fastsgd.bench.hosts` runs it
                from fastsgd.bench.hosts import check_config
                check_config(config)
        except UserError as e:
            raise ConfigError(f"the cell {_describe(keys, values)}: {e}") from None
        cell = Cell(cell_mode, config, tuple(zip(keys, values)))
        if all(cell.id != c.id for c in out):  # the same run twice is one cell
            out.append(cell)
    return out


def _merge(raw: dict[str, Any], key: str, section: str, table: Any) -> None:
    """Merge an axis value's table into `section` of the cell's raw configuration."""
    if not isinstance(table, dict):
        raise ConfigError(f"axes.{key}: a section's values are tables, e.g. "
                          f"{{name = ...}}; or name a key as {key}.KEY")
    table = {k: v for k, v in table.items() if k != "label"}  # the value's name
    for name in table:
        if section not in cfg.SCHEMA or (name not in cfg.SCHEMA[section]
                                         and section not in cfg.OPEN_SECTIONS):
            raise ConfigError(f"axes.{key}: no such key {section}.{name} "
                              "(fastsgd keys lists them)")
    raw.setdefault(section, {}).update(table)


def _joint(key: str, value: Any) -> dict[str, Any]:
    """A joint axis's value: a table of sections (and "mode"), e.g. {label = "4 real",
    mode = "run", run = {workers = 4}}, for settings that vary together across sections."""
    if not isinstance(value, dict):
        raise ConfigError(f"axes.{key}: not a section of the configuration, so a joint axis "
                          "whose values are tables of sections, e.g. {run = {workers = 4}, "
                          'mode = "run"}; fastsgd keys lists the sections')
    joint = {k: v for k, v in value.items() if k != "label"}
    unknown = sorted(set(joint) - set(cfg.SCHEMA) - {"mode"})
    if unknown:
        raise ConfigError(f"axes.{key}: {unknown[0]} is neither a section of the "
                          "configuration nor mode (fastsgd keys lists the sections)")
    return joint


def _check_strategy(config: dict[str, Any]) -> None:
    """What Job checks of a named strategy before it starts: does its topology, or its
    number of servers, fit the workers?"""
    if is_import_path(config["strategy"]["name"]):
        return  # the user's own class: its cell checks it when it runs
    check = hook(build_strategy(config["strategy"]), "check")
    if check is not None:
        check(config["run"]["workers"])


def _mode(value: Any, key: str = "mode") -> str:
    if value not in MODES:
        where = "axes.mode" if key == "mode" else f"axes.{key}'s mode"
        raise ConfigError(f"{where}: {value!r} is not 'simulate', 'run' or 'hosts'")
    return value


def _describe(keys: list[str], values: tuple[Any, ...]) -> str:
    def show(key: str, value: Any) -> str:
        if isinstance(value, dict):  # a section's table: its label, or its values in order
            value = value.get("label") or "/".join(
                show("", v)[1:] if isinstance(v, dict) else str(v) for v in value.values())
        return f"{key}={value}".replace(" ", "")  # one word per axis
    return " ".join(show(k, v) for k, v in zip(keys, values)) or "(the base)"
