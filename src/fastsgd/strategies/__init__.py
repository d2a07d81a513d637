"""Global training strategies, chosen by `[strategy] name` (one file per family)."""

from __future__ import annotations

from typing import Any

from fastsgd.errors import ConfigError
from fastsgd.options import validate_section
from fastsgd.strategies.allreduce import AllReduce
from fastsgd.strategies.base import Context, Strategy

STRATEGIES: dict[str, type] = {"allreduce": AllReduce}

__all__ = ["STRATEGIES", "AllReduce", "Context", "Strategy", "build_strategy",
           "validate_options"]


def _strategy_class(name: str) -> type:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy '{name}' (strategy.name); "
                          f"choose one of: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name]


def validate_options(section: dict[str, Any]) -> dict[str, Any]:
    """Check the [strategy] keys against the chosen strategy's options; fill defaults."""
    name = section["name"]
    options = {k: v for k, v in section.items() if k != "name"}
    checked = validate_section("strategy", options, _strategy_class(name).OPTIONS)
    return {"name": name, **checked}


def build_strategy(section: dict[str, Any]) -> Strategy:
    section = validate_options(section)
    options = {k: v for k, v in section.items() if k != "name"}
    return _strategy_class(section["name"])(**options)
