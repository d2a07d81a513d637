"""Typed, range-checked settings: the one schema used by the config file, the CLI and the API."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from fastsgd.config.objects import is_import_path, resolve
from fastsgd.errors import ConfigError

Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Option:
    """One setting (`fastsgd.Option`): a config key, or an option of a strategy or codec.

    - `type`: bool, int, float, str, list or dict; a value of another type is refused (an
      int is taken for a float);
    - `default`: the value where the config says nothing (it must pass `check` itself);
    - `check`: None, or a function of the value returning None where it is fine and else
      what is wrong, e.g. "must be > 0" (`positive`, `at_least`, `between`, `one_of`);
    - `doc`: one line, what `fastsgd keys` prints beside the key;
    - `steps`: the value counts training steps (a period, a warm-up): a run that is not
      longer says so at its start (`reaching_past`).
    """

    type: type
    default: Any
    check: Check | None = None
    doc: str = ""
    steps: bool = False

    def with_default(self, default: Any) -> Option:
        return replace(self, default=default)

    def validate(self, key: str, value: Any) -> Any:
        """Return `value` converted to this option's type, or raise ConfigError naming `key`."""
        coerced = _coerce(self.type, value)
        if coerced is None and self.check and self.type is str and _number(value):
            problem = self.check(str(value))  # 20 for a time: say what a time looks like
            if problem:
                raise ConfigError(f"{key} {problem}, got {value!r}")
        if coerced is None:
            raise ConfigError(f"{key} must be of type {self.type.__name__}, "
                              f"got {value!r} ({type(value).__name__})")
        problem = _representable(coerced) or (self.check(coerced) if self.check else None)
        if problem:
            raise ConfigError(f"{key} {problem}, got {value!r}")
        return coerced

    def line(self, key: str) -> str:
        """`key`'s line in `fastsgd keys`: its type, default and meaning."""
        default = toml_value(self.default)
        return f"  {key:<19} {self.type.__name__:<5} {default:<16} {self.doc}".rstrip()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def reaching_past(section: str, schema: dict[str, Option], options: dict[str, Any],
                  total: int) -> list[str]:
    """One line for each step-count option (`Option.steps`) whose value reaches the end of a
    run of `total` steps: what it paces happens only at the end, or never (issue 51, C)."""
    return [f"{section}.{key} = {options[key]} is not below the run's {total} steps "
            f"({option.doc}): what it paces happens only at the end or not at all; set it "
            f"below {total}, or train longer"
            for key, option in schema.items()
            if option.steps and isinstance(options.get(key), int) and options[key] >= total]


INT64 = 2 ** 63  # TOML's integers are 64-bit; torch's seeds and counters are too


def _representable(value: Any) -> str | None:
    """Every number of a config is finite, and every integer fits in 64 bits, also inside a
    list or table: an inf passes most range checks (inf > 0) and a NaN gets a misleading
    message, and either fails later, deep inside."""
    if isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        bad = any(_representable(v) for v in items)
        return "must hold only finite numbers and integers of 64 bits" if bad else None
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return "must be an integer from -2**63 to 2**63 - 1"
    return None


def _coerce(kind: type, value: Any) -> Any:
    if kind is bool:
        return value if isinstance(value, bool) else None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer beyond any float: as TOML's 1e400, inf
            return math.inf
    if kind in (int, float) and isinstance(value, bool):
        return None
    return value if isinstance(value, kind) else None


def toml_value(v: Any) -> str:
    """`v` written as a TOML value (a config's scalars, flat lists and inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def _toml_key(key: Any) -> str:
    text = str(key)
    return text if text.replace("_", "").replace("-", "").isalnum() else toml_value(text)


def at_least(low: float) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}"


def positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def between(low: float, high: float) -> Check:
    return lambda v: None if low <= v <= high else f"must be in [{low}, {high}]"


def one_of(choices: Iterable[str]) -> Check:
    allowed = tuple(choices)
    return lambda v: None if v in allowed else f"must be one of {', '.join(allowed)}"


def validate_section(section: str, values: dict[str, Any], schema: dict[str, Option],
                     ignore: Iterable[str] = ()) -> dict[str, Any]:
    """Fill defaults and check every key of `values` against `schema`; unknown keys are errors."""
    skip = set(ignore)
    unknown = sorted(set(values) - set(schema) - skip)
    if unknown:
        raise ConfigError(unknown_key_message(f"{section}.{unknown[0]}", section, schema))
    out = {key: option.validate(f"{section}.{key}", values.get(key, option.default))
           for key, option in schema.items()}
    return {**out, **{k: values[k] for k in sorted(skip) if k in values}}


def unknown_key_message(key: str, section: str, schema: dict[str, Option]) -> str:
    import difflib

    name = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(name, list(schema), n=1)
    hint = f" (did you mean {section}.{close[0]}?)" if close else ""
    known = ", ".join(sorted(schema)) or "none"
    return f"unknown config key '{key}'{hint}; known keys in [{section}]: {known}"


class Registry:
    """Named components of one kind (strategies, codecs), each class with an OPTIONS schema;
    a config section `{name = ..., option = ...}` selects and configures one. A name may
    also be an import path `module:Class`, the user's own class, which `contract` checks
    (raising ConfigError in one line) before anything uses it."""

    def __init__(self, section: str, kind: str, classes: dict[str, type],
                 contract: Callable[[type], None] | None = None):
        self.section, self.kind, self.classes = section, kind, classes
        self.contract = contract

    def __contains__(self, name: str) -> bool:
        return name in self.classes

    def __iter__(self):
        return iter(sorted(self.classes))

    def get(self, name: str) -> type:
        """A registered class, or the class an import path `module:Class` names."""
        if is_import_path(name):
            cls = resolve(name, f"{self.section}.name")
            if self.contract is not None:
                self.contract(cls)
            return cls
        if name not in self.classes:
            raise ConfigError(self.unknown(name))
        return self.classes[name]

    def unknown(self, name: Any) -> str:
        """The line for a name that is neither built in nor an import path."""
        import difflib

        close = difflib.get_close_matches(str(name), list(self.classes), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return (f"unknown {self.kind} '{name}' ({self.section}.name){hint}; choose one of: "
                f"{', '.join(sorted(self.classes))}, or name your own class as "
                f"{self.section}.name = \"module:Class\" (docs/extending.md)")

    def validate(self, values: dict[str, Any]) -> dict[str, Any]:
        """Check the section's keys against the chosen component's options; fill defaults."""
        name = values["name"]
        options = {k: v for k, v in values.items() if k != "name"}
        schema = getattr(self.get(name), "OPTIONS", {})
        return {"name": name, **validate_section(self.section, options, schema)}

    def build(self, values: dict[str, Any]) -> Any:
        checked = self.validate(values)
        return self.get(checked.pop("name"))(**checked)


def describe(schema: dict[str, dict[str, Option]], registries: dict[str, Registry]) -> str:
    """Every section and key of `schema` (`fastsgd keys`), and in a section that a registry
    configures, each component's options."""
    lines = []
    for section, options in schema.items():
        lines.append(f"[{section}]")
        lines += [o.line(k) for k, o in options.items()]
        registry = registries.get(section, ())
        for name in registry:
            own = registry.get(name).OPTIONS
            lines.append(f"  name = \"{name}\"" + ("" if own else ": no options"))
            lines += ["  " + o.line(k) for k, o in own.items()]
        lines.append("")
    return "\n".join(lines)


class Configurable:
    """A component configured by an OPTIONS schema (`fastsgd.Configurable`; StrategyBase and
    Codec are ones). Building one in Python checks its arguments exactly as the config
    file's keys are checked (a ConfigError naming the key), and `options` records the
    checked values, which is what a run's config.toml writes.

    - `OPTIONS` (default {}): option name -> `Option`, one for each argument of `__init__`;
    - `SECTION`: the config section, named by a subclass:
      `class Mine(Configurable, section="strategy")`;
    - `options`: the checked arguments the object was built with, defaults filled in.
    """

    OPTIONS: ClassVar[dict[str, Option]] = {}
    SECTION: ClassVar[str] = ""

    def __init_subclass__(cls, section: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if section is not None:
            cls.SECTION = section
        if "__init__" in cls.__dict__:
            cls.__init__ = _checked(cls.__dict__["__init__"])  # type: ignore[method-assign]

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.__dict__.get("_options", {}))


def _checked(init: Callable[..., None]) -> Callable[..., None]:
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Configurable, *args: Any, **kwargs: Any) -> None:
        if self.__dict__.get("_options") is not None:  # a base class's __init__, via super()
            return init(self, *args, **kwargs)
        given = _arguments(signature, self, args, kwargs)
        self._options = validate_section(self.SECTION or type(self).__name__, given,
                                         self.OPTIONS)
        init(self, *args, **kwargs)

    return wrapper


def _arguments(signature: inspect.Signature, obj: Any, args: tuple,
               kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor's arguments by name (a **kwargs catch-all flattened; None = default)."""
    try:
        bound = signature.bind(obj, *args, **kwargs)
    except TypeError as e:
        raise ConfigError(f"{type(obj).__name__}: {e}") from None
    given: dict[str, Any] = {}
    for name, value in list(bound.arguments.items())[1:]:
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            given.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            given[name] = value
    return {k: v for k, v in given.items() if v is not None}
