"""Reading TOML: a config or spec file, and `--set key=value` items, each wrong one in one
line naming the file or the item (see config.py for what the keys mean)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastsgd.errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def read_toml(path: Path) -> dict:
    if Path(path).suffix == ".py":
        raise ConfigError(f"{path} is a Python script, not a TOML config: run it with "
                          f"python3 {path}, or make a job archive of it (fastsgd pack {path})")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as e:  # a folder, no permission
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text (TOML)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"malformed TOML in {path}: {e}") from None


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`--set` items as {"section.key": value}."""
    out = {}
    for item in items:
        key, value = parse_override(item)
        if not key.partition(".")[2]:
            raise ConfigError(f"--set {item}: the key must be section.name, e.g. run.workers")
        out[key] = value
    return out


def parse_override(item: str) -> tuple[str, Any]:
    """`a.b=1` -> ('a.b', 1). The value is read as TOML, else taken as a plain string."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item}: expected KEY=VALUE in one word, e.g. "
                          f"--set {key.strip() or 'run.workers'}=4")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    return key.strip(), value
