"""Global training strategies, chosen by `[strategy] name` (one file per family)."""

from __future__ import annotations

from fastsgd.options import Registry
from fastsgd.strategies.allreduce import AllReduce
from fastsgd.strategies.base import Context, Strategy

STRATEGIES = Registry("strategy", "strategy", {"allreduce": AllReduce})
validate_options = STRATEGIES.validate
build_strategy = STRATEGIES.build

__all__ = ["STRATEGIES", "AllReduce", "Context", "Strategy", "build_strategy",
           "validate_options"]
