"""The TOML configuration: defaults, `--set key=value` overrides, validation, writing; the keys
themselves are in keys.py.

A config is a plain dict of sections. Strategy and compression sections carry options that
belong to the chosen strategy or codec; their registries validate those keys.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastsgd.config.keys import KIT_KEYS, SCHEMA
from fastsgd.config.objects import is_import_path
from fastsgd.config.options import (
    Registry,
    describe,
    toml_value,
    validate_section,
)
from fastsgd.config.toml_files import parse_overrides, read_toml
from fastsgd.errors import ConfigError

MOVED = {("run", "slowdown"): "compute"}  # keys of older configs, read where they live now
OPEN_SECTIONS = ("strategy", "compression")  # their other keys belong to the chosen component
# The registries the open sections choose from ({"strategy": STRATEGIES, "compression": CODECS},
# fastsgd.strategies.CHOICES): passed in, since this layer lies below the strategies and codecs.
Choices = Mapping[str, Registry]


def defaults() -> dict[str, dict[str, Any]]:
    return {s: {k: o.default for k, o in opts.items()} for s, opts in SCHEMA.items()}


def load(choices: Choices, path: str | Path | None = None,
         overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Read a TOML file (or start from the defaults), apply `key=value` overrides, validate."""
    raw: dict[str, Any] = read_toml(Path(path)) if path is not None else {}
    return validate(with_options(raw, parse_overrides(overrides), choices, str(path or "")),
                    choices)


def tables(raw: dict, source: str = "") -> dict:
    """A copy of `raw` whose sections are fresh dicts, before options are set in them: a
    section that is unknown or not a table (`run = 5`, `[[run]]`) is an error naming it
    and `source` (the file)."""
    where = f"{source}: " if source else ""
    unknown = sorted(set(raw) - set(SCHEMA))
    if unknown:
        owners = [s for s, keys in SCHEMA.items() if unknown[0] in keys]
        hint = (f" ({unknown[0]} is a key of [{owners[0]}]: write it under that table)"
                if owners and not isinstance(raw[unknown[0]], dict) else "")
        raise ConfigError(f"{where}unknown config section [{unknown[0]}]{hint}; known: "
                          f"{', '.join(SCHEMA)}")
    for section, values in raw.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{where}[{section}] must be a table of key = value, "
                              f"got {section} = {toml_value(values)}")
    return {section: dict(values) for section, values in raw.items()}


def with_options(raw: dict, options: dict[str, Any], choices: Choices, source: str = "") -> dict:
    """A copy of `raw` (a file's sections) with `options` {"section.key": value} set in it.
    An option that picks another strategy or codec than the file does drops the file's keys
    of that section: they configured the other one (a run's config.toml, which records
    every option, run again with another strategy: allreduce's `overlap = true` is not
    diloco's `overlap`, nor diloco's default period localsgd's). The options' own keys stay
    checked."""
    raw = tables(raw, source)
    for key, value in options.items():
        section, _, name = key.partition(".")
        if not name:
            raise ConfigError(f"option {key!r}: the key must be section.name, e.g. run.steps")
        if section in OPEN_SECTIONS and name == "name":
            raw[section] = _switched(raw.get(section, {}), value,
                                     SCHEMA[section]["name"].default)
    for key, value in options.items():
        section, _, name = key.partition(".")
        raw.setdefault(section, {})[name] = value
    return raw


def _switched(values: dict, name: Any, default: str) -> dict:
    """`values` of a strategy or codec section, or nothing of them if `name` (the new
    choice) is another than values' own."""
    if not isinstance(name, str) or name == values.get("name", default):
        return values
    return {}


def validate(raw: dict, choices: Choices) -> dict:
    """Return a complete config: every section and key filled and checked."""
    raw = _moved_keys(tables(raw))
    config = {}
    for section, schema in SCHEMA.items():
        values = raw.get(section, {})
        ignore = set(values) - set(schema) if section in OPEN_SECTIONS else ()
        if section == "optimizer" and is_import_path(values.get("name")):
            # the class's keyword arguments, checked by it; the schedule and clipping, here
            ignore = set(values) - {"name", *KIT_KEYS}
            schema = {k: schema[k] for k in ("name", *KIT_KEYS)}
        config[section] = validate_section(section, values, schema, ignore)
    for section in OPEN_SECTIONS:
        config[section] = choices[section].validate(config[section])
    return config


def _moved_keys(raw: dict) -> dict:
    """A config written before a key moved still reads (its run.slowdown is compute.slowdown)."""
    for (section, key), now in MOVED.items():
        if key in raw.get(section, {}):  # raw: tables()'s copy
            raw.setdefault(now, {}).setdefault(key, raw[section].pop(key))
    return raw


def merged(config: dict, choices: Choices, **sections: dict) -> dict:
    """A copy of `config` with some keys of some sections replaced, validated again."""
    out = copy.deepcopy(config)
    for section, values in sections.items():
        out.setdefault(section, {}).update(values)
    return validate(out, choices)


def to_toml(config: dict) -> str:
    """Write a config (sections of scalars and flat lists) as TOML."""
    lines = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def describe_keys(choices: Choices) -> str:
    """Every section and key with its type, default and meaning (`fastsgd keys`), and the
    options of each strategy and codec."""
    return describe(SCHEMA, dict(choices))


PATHS = (("data", "path"), ("compute", "trace"))  # files a configuration names


def paths_from(raw: dict, folder: Path) -> None:
    """Make the relative files `raw` names (data.path, each of its `:`-separated parts, and
    compute.trace) absolute, from `folder`: a config file's own, else the working one."""
    for section, key in PATHS:
        values = raw.get(section)
        if isinstance(values, dict) and isinstance(values.get(key), str) and values[key]:
            values[key] = ":".join(str(folder / Path(part).expanduser()) if part else part
                                   for part in values[key].split(":"))


def absolute_options(options: dict[str, Any]) -> dict[str, Any]:
    """Options' relative data.path and compute.trace, from the working directory."""
    raw: dict[str, dict] = {}
    for key in ("data.path", "compute.trace"):
        if isinstance(options.get(key), str):
            section, name = key.split(".")
            raw[section] = {name: options[key]}
    paths_from(raw, Path.cwd())
    return {**options, **{f"{s}.{k}": v for s, values in raw.items() for k, v in values.items()}}
