"""What fastsgd checks of a plugin class (a strategy, a codec) before a run starts: the
parts of the contract that strategies and codecs share, its `name`, its `OPTIONS`, its
constructor and its methods. Each check returns the mistake in words, or None; `refused`
makes of it the one line that names the class (strategies/contract.py, compress/contract.py).
"""

from __future__ import annotations

import inspect

from fastsgd.config.objects import described, import_path
from fastsgd.config.options import Option
from fastsgd.errors import ConfigError

RESERVED = ("name",)  # `[strategy] name` chooses the class: no option may be called so


def refused(kind: str, cls: type, problem: str) -> ConfigError:
    """The one line for a broken contract: `strategy class mod:Class has no name: ...`."""
    return ConfigError(f"{kind} class {import_path(cls)} {problem}")


def name_problem(cls: type) -> str | None:
    """`name`: a class attribute, a non-empty str (runs and reports call the class by it)."""
    if not hasattr(cls, "name"):
        return ('has no name: give it a class attribute name = "..." (a str that runs and '
                "reports call it by)")
    name = inspect.getattr_static(cls, "name")
    if not isinstance(name, str) or not name:
        got = repr(name) if isinstance(name, str) else described(name)
        return f"has name = {got}: it must be a class attribute, a non-empty str"
    return None


def options_problem(cls: type) -> str | None:
    """`OPTIONS`: a dict of option name -> fastsgd.Option, each default valid."""
    options = getattr(cls, "OPTIONS", {})
    if not isinstance(options, dict):
        return (f"has OPTIONS = {described(options)}: it must be a dict of option name: "
                "fastsgd.Option")
    for key, option in options.items():
        if not isinstance(key, str) or not key.isidentifier() or key in RESERVED:
            return (f"declares the option {key!r}: an option's name must be a Python "
                    f"identifier other than {', '.join(RESERVED)}")
        if not isinstance(option, Option):
            return (f"has OPTIONS[{key!r}] = {described(option)}: it must be a fastsgd.Option, "
                    f"e.g. Option(float, 0.1, doc=\"...\")")
        try:
            option.validate(key, option.default)
        except ConfigError as e:
            return f"has an OPTIONS default that fails its own check: {e}"
    return None


def constructor_problem(cls: type) -> str | None:
    """Each constructor argument is an option (the config sets it, config.toml records it),
    and each option a constructor argument (the config's value reaches the object)."""
    options = getattr(cls, "OPTIONS", {})
    parameters = _constructor_parameters(cls)
    if parameters is None:
        return None  # no signature to read: built as it is
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    undeclared = [name for name in named if name not in options]
    if undeclared:
        return (f"takes {undeclared[0]!r} in __init__, which its OPTIONS do not declare: "
                "declare each constructor argument as a fastsgd.Option in OPTIONS, so that "
                "the config can set it and config.toml records it")
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    unused = [key for key in options if key not in named]
    if unused:
        return (f"declares the option {unused[0]!r} in OPTIONS, which its __init__ does not "
                "take: the config's value would not reach the object")
    return None


def _constructor_parameters(cls: type) -> list[inspect.Parameter] | None:
    """`cls.__init__`'s parameters after self ([] for object's own), or None if unreadable."""
    if cls.__init__ is object.__init__:
        return []
    try:
        return list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None


def unlike(cls: type, methods: dict[str, str], kind: str) -> str | None:
    """A class with none of a plugin's `methods` (torch.nn.Linear named as a strategy): not
    one missing a part of the contract, but another kind of class altogether."""
    if not any(callable(getattr(cls, method, None)) for method in methods):
        return f"has none of a {kind}'s methods ({', '.join(methods)}): it is not one"
    return None


def missing_method(cls: type, methods: dict[str, str]) -> str | None:
    """The first of `methods` (name -> how it is called) that `cls` lacks or leaves abstract."""
    abstract = getattr(cls, "__abstractmethods__", frozenset())
    for method, call in methods.items():
        if not callable(getattr(cls, method, None)) or method in abstract:
            return f"lacks {method}{call}, which fastsgd calls"
    return None

