"""The strategy contract, checked when a job starts: a mistake in a strategy class ends the
job in one line naming the class and the mistake, before any worker trains.

`check_strategy_class` runs where a class enters fastsgd: a `strategy.name = "module:Class"`
(the registry, strategies/__init__.py), an object given to `fastsgd.Job` or `Replica`
(loop/components.py, loop/replica.py) and the conformance suite (testing/).
"""

from __future__ import annotations

import inspect

from fastsgd.config.plugins import (
    constructor_problem,
    missing_method,
    name_problem,
    options_problem,
    refused,
    unlike,
)
from fastsgd.strategies.base import StrategyBase
from fastsgd.strategies.capabilities import (
    HOOKS,
    LEGACY,
    Capabilities,
    capabilities_of,
    legacy_flags,
)

METHODS = {"init": "(params, ctx)", "on_gradients": "(params, state, ctx)",
           "on_parameters": "(params, state, ctx)", "close": "()"}


def check_strategy_class(cls: type) -> None:
    """ConfigError, in one line naming `cls` and its first mistake; None if it keeps the
    contract (StrategyBase's docstrings)."""
    if not isinstance(cls, type):
        raise TypeError(f"check_strategy_class takes a class, not {cls!r}")
    problem = (unlike(cls, METHODS, "strategy") or name_problem(cls)
               or missing_method(cls, METHODS) or _hooks_problem(cls)
               or options_problem(cls) or constructor_problem(cls)
               or capabilities_problem(cls))
    if problem:
        raise refused("strategy", cls, problem)


def check_strategy(strategy: object) -> None:
    """`check_strategy_class` of an object's class, then the object's own capabilities
    (which its options may decide, as diloco's do)."""
    check_strategy_class(type(strategy))
    problem = capabilities_problem(strategy)
    if problem:
        raise refused("strategy", type(strategy), problem)


def capabilities_problem(strategy: object) -> str | None:
    """Declared capabilities of the wrong type (a str for a tuple of kinds, "yes" for True),
    in a `capabilities` value or in the old upper-case attributes; both at once is a mistake
    too, as only the value is read."""
    declared = getattr(strategy, "capabilities", None)
    old = legacy_flags(strategy)
    if declared is None:
        return capabilities_of(strategy).problem(LEGACY.__getitem__)
    if not isinstance(declared, Capabilities):
        return (f"has capabilities = {declared!r}: it must be a fastsgd.Capabilities, e.g. "
                "Capabilities(codec_kinds=(\"exact\",))")
    if old:
        return (f"sets {old[0]} beside its capabilities, which fastsgd reads alone: move it "
                f"into capabilities = Capabilities({old[0].lower()}=...)")
    return declared.problem()


def _hooks_problem(cls: type) -> str | None:
    """An optional method that is no method, or half a pair (what in_flight_state saves,
    load_in_flight must take back)."""
    for name in HOOKS:
        if hasattr(cls, name) and not callable(inspect.getattr_static(cls, name)):
            return f"has {name} that is not a method: it must be def {name}{HOOKS[name]}"
    own = {name for name in ("in_flight_state", "load_in_flight") if _own(cls, name)}
    if len(own) == 1:
        lacking = ({"in_flight_state", "load_in_flight"} - own).pop()
        return (f"defines {own.pop()} without {lacking}{HOOKS[lacking]}: a resume must give "
                "back what a checkpoint saved")
    return None


def _own(cls: type, name: str) -> bool:
    """Does `cls` define `name` itself, not keep StrategyBase's default?"""
    found = getattr(cls, name, None)
    return found is not None and found is not getattr(StrategyBase, name, None)
