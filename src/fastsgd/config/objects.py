"""Python objects in a config: recorded as import paths (`module:Name`), rebuilt by import.

A run's config.toml must say what ran, also when the model, step, optimizer, strategy or
codec was given as a Python object. What can be imported again is written as its import
path; what cannot is written as what it was (a lambda `mod:<lambda>`, a function defined
inside another `mod:outer.<locals>.f`, anything defined in the script that was run
`__main__:f`, an instance `<instance of mod:Class>`), and re-running the file refuses it in
one line naming the key.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from fastsgd.errors import ConfigError, UserError

# What an import path under each key must name (a module or a constant never is), and the
# methods of a class there (a plugin: its registry's contract names what one lacks, in one
# line, not a TypeError where it is first used: strategies/contract.py, compress/contract.py).
WANTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "model.name": ("a class or function making a torch.nn.Module with no arguments", ()),
    "data.name": ("a function making a fastsgd.data.Dataset with no arguments", ()),
    "model.step": ("a function(model, batch) -> loss", ()),
    "model.evaluate": ("a function(model, dataset, device) -> (accuracy, loss)", ()),
    "optimizer.name": ("a torch.optim.Optimizer class, or a function(params, **options) "
                       "making one", ()),
    "strategy.name": ("a strategy class (with init, on_gradients, on_parameters, close)",
                      ("init", "on_gradients", "on_parameters", "close")),
    "compression.name": ("a compressor class (with init, encode, compress, decode, nbytes)",
                         ("init", "encode", "compress", "decode", "nbytes")),
}


def import_path(obj: Any) -> str:
    """`module:QualName` of a class or function, the shortest public module that exports
    it (`torch.optim:Adam`, not `torch.optim.adam:Adam`); `<...>` where no import finds it."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname:
        return f"<instance of {import_path(type(obj))}>"
    parts = module.split(".")
    for k in range(1, len(parts)):
        parent = ".".join(parts[:k])
        if getattr(sys.modules.get(parent), qualname, None) is obj:
            return f"{parent}:{qualname}"
    return f"{module}:{qualname}"


def is_import_path(value: Any) -> bool:
    return isinstance(value, str) and (":" in value or value.startswith("<"))


# fastsgd's own modules that a run's config.toml may name from before they moved into
# layer folders (2026-12): an older run directory still resumes.
MOVED_MODULES = {"fastsgd.models": "fastsgd.workloads.models",
                 "fastsgd.data": "fastsgd.workloads.data",
                 "fastsgd.plan": "fastsgd.loop.plan", "fastsgd.options": "fastsgd.config.options"}


def resolve(value: str, key: str) -> Any:
    """The object an import path names, or ConfigError naming `key` and why it cannot be."""
    why = not_rebuildable(value)
    if why:
        raise ConfigError(f"{key} = '{value}' cannot be rebuilt from a config file: {why}")
    module_name, _, qualname = value.partition(":")
    module_name = MOVED_MODULES.get(module_name, module_name)
    if os.getcwd() not in sys.path:  # as `python -m` would: the user's modules are here
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{key} = '{value}': cannot import {module_name} ({e})") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{key} = '{value}': {module_name} has no {qualname}")
        obj = getattr(obj, part)
    check_kind(obj, value, key)
    return obj


def check_kind(obj: Any, value: str, key: str) -> None:
    """ConfigError if `obj`, found at import path `value`, is not what `key` must name (a
    class, where the key names a plugin; its registry checks the class's methods)."""
    if key not in WANTED:
        return
    what, methods = WANTED[key]
    fits = callable(obj) and (not methods or isinstance(obj, type))
    if not fits:
        raise ConfigError(f"{key} = '{value}' names {described(obj)}; it must name {what}")


def described(obj: Any) -> str:
    """'a module', 'a class', 'a function' or 'a str' (what the object is, in a message)."""
    if inspect.ismodule(obj):
        return "a module"
    if isinstance(obj, type):
        return "a class"
    return "a function" if callable(obj) else with_article(type(obj).__name__)


def with_article(name: str) -> str:
    """'an int', 'a StepLR', 'an SGD' (an acronym's article is its first letter's, spoken)."""
    acronym = name[:2].isupper()
    vowel = name[0] in "AEFHILMNORSX" if acronym else name[0].lower() in "aeiou"
    return f"{'an' if vowel else 'a'} {name}"


def not_rebuildable(value: str) -> str | None:
    """Why an import path cannot be imported again, or None."""
    module, _, qualname = value.partition(":")
    if value.startswith("<"):
        return "it was a Python object given to the API; pass it again, or name an import path"
    if not qualname:
        return "expected module:Name"
    if "<lambda>" in qualname:
        return "it was a lambda; define a function or class in a module and pass that"
    if "<locals>" in qualname:
        return "it was defined inside a function; define it at the top of a module"
    if module == "__main__":
        return "it was defined in the script that was run (__main__); move it into a module"
    return None


def check_arguments(fn: Callable[..., Any], arguments: int, message: str,
                    error: type[UserError] = UserError) -> None:
    """`error(message)` unless `fn` can be called with `arguments` positional arguments."""
    try:
        inspect.signature(fn).bind(*[None] * arguments)
    except TypeError:
        raise error(message) from None
    except ValueError:
        pass  # no signature to read (some built-ins): it is called as it is
