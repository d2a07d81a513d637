"""The optimizer a Job steps each worker with: built from the [optimizer] section, or the
Python API's factory checked and recorded as that section's keys."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fastsgd.config.keys import KIT_KEYS, SCHEMA
from fastsgd.config.objects import (
    WANTED,
    check_arguments,
    described,
    import_path,
    is_import_path,
    resolve,
)
from fastsgd.errors import ConfigError, UserError

OptimizerFn = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def optimizer_from_config(section: dict[str, Any]) -> OptimizerFn:
    """The optimizer the [optimizer] section describes (state stays with each worker).
    sgd, adam and adamw (weight decay decoupled, Loshchilov & Hutter 2019) take torch's
    multi-tensor path (`foreach`), its default on GPUs only: on a CPU it gives the
    single-tensor path's bits with fewer Python calls (an MLP's SGD update took 0.46 ms
    instead of 0.66), which a simulator stepping hundreds of workers pays on every one."""
    if is_import_path(section["name"]):
        make = functools.partial(_imported_optimizer, section,
                                 resolve(section["name"], "optimizer.name"))
        # a bad option fails now, in one line
        _check_steps_alone(make([torch.nn.Parameter(torch.zeros(1))]),
                           f"optimizer.name = '{section['name']}'", ConfigError)
        return make
    lr, wd = section["lr"], section["weight_decay"]
    _check_applies(section)
    if section["name"] in ("adam", "adamw"):
        adam = torch.optim.AdamW if section["name"] == "adamw" else torch.optim.Adam
        betas = {"betas": tuple(section["betas"])} if "betas" in section else {}
        return lambda params: adam(params, lr=lr, weight_decay=wd, foreach=True, **betas)
    momentum, nesterov = section["momentum"], section["nesterov"]
    if nesterov and momentum == 0:
        raise UserError("optimizer.nesterov = true needs optimizer.momentum > 0")
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd,
                                          nesterov=nesterov, foreach=True)


def _check_applies(section: dict[str, Any]) -> None:
    """A key set that the built-in optimizer named would ignore: refused in one line."""
    name = section["name"]
    adam = name in ("adam", "adamw")
    if adam and section.get("nesterov"):
        raise ConfigError(f"optimizer.nesterov applies to optimizer.name = 'sgd', not "
                          f"'{name}' (Adam's momentum is optimizer.betas)")
    betas = list(section.get("betas", SCHEMA["optimizer"]["betas"].default))
    if not adam and betas != SCHEMA["optimizer"]["betas"].default:
        raise ConfigError(f"optimizer.betas applies to optimizer.name = 'adam' or 'adamw', "
                          f"not '{name}' (SGD's momentum is optimizer.momentum)")


def _imported_optimizer(section: dict[str, Any], make: Callable[..., Any],
                        params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer `make` (what optimizer.name's import path names), given the section's
    other keys as options."""
    name = section["name"]
    if isinstance(make, type) and not issubclass(make, torch.optim.Optimizer):
        raise ConfigError(f"optimizer.name = '{name}' names a class that is not a "
                          f"torch.optim.Optimizer; it must name {WANTED['optimizer.name'][0]}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items()
              if k != "name" and k not in KIT_KEYS}
    try:
        optimizer = make(params, **kwargs)
    except (TypeError, ValueError) as e:  # an option it does not take, or a bad value
        raise ConfigError(f"optimizer.name = '{name}': {e}") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"optimizer.name = '{name}' made {described(optimizer)}, not a "
                          "torch.optim.Optimizer")
    return optimizer


def record_optimizer(factory: Any) -> dict[str, Any]:
    """The optimizer's class and its `defaults`, found by building it on a probe parameter;
    the factory's own import path where that would not say everything (parameter groups)."""
    if isinstance(factory, str):
        return {"name": factory}
    optimizer = _probe_optimizer(factory)
    if optimizer is None:  # it needs the model's own parameters
        return {"name": import_path(factory)}
    try:
        groups, defaults = optimizer.param_groups, optimizer.defaults
        options = {k: _toml(v) for k, v in defaults.items() if v is not None}
        plain = len(groups) == 1 and all(groups[0].get(k) == v for k, v in defaults.items())
    except Exception:  # noqa: BLE001 - whatever the probe does, the factory itself is recorded
        return {"name": import_path(factory)}
    if not plain or any(v is None for v in options.values()):
        return {"name": import_path(factory)}
    cls = type(optimizer)
    options = {k: v for k, v in options.items() if _takes(cls, k)}
    if not _rebuilt_alike(cls, options, defaults):
        return {"name": import_path(factory)}
    return {"name": import_path(cls), **options}


def _takes(cls: type, key: str) -> bool:
    """Whether `cls(params, key=...)` is a call its constructor accepts: a user's subclass
    of AdamW may take only lr and weight_decay, though its `defaults` hold AdamW's all."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return True  # no signature to read: recorded, and checked by the rebuild
    return key in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _rebuilt_alike(cls: type, options: dict[str, Any], defaults: dict[str, Any]) -> bool:
    """Whether the class built from the recorded options has the probe's defaults again, as
    `fastsgd run --resume` will build it."""
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    try:
        again = cls([torch.nn.Parameter(torch.zeros(1))], **kwargs).defaults
    except Exception:  # noqa: BLE001 - not rebuilt from its keys: the factory is recorded
        return False
    return again.keys() == defaults.keys() and all(
        _toml(again[k]) == _toml(defaults[k]) for k in defaults)


def _probe_optimizer(factory: Any) -> Any:
    """What the API's optimizer argument makes of a probe parameter (None where that raises:
    it may want the model's real parameters); UserError where it can never be an optimizer
    fastsgd's loop can step."""
    named = "the optimizer argument must be a function(params) -> torch.optim.Optimizer"
    if isinstance(factory, torch.optim.Optimizer):
        cls = import_path(type(factory)).replace(":", ".")
        raise UserError(f"{named}; got {described(factory)} instance: pass a function, e.g. "
                        f"lambda params: {cls}(params, lr=0.05)")
    if not callable(factory):
        raise UserError(f"{named}; got {described(factory)}")
    check_arguments(factory, 1, f"{named}; {import_path(factory)} does not take one argument")
    try:
        optimizer = factory([torch.nn.Parameter(torch.zeros(1))])
    except Exception:  # noqa: BLE001 - the workers build it on the model's own parameters
        return None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"{named}; it returned {described(optimizer)}")
    _check_steps_alone(optimizer, "the optimizer argument", UserError)
    return optimizer


def _check_steps_alone(optimizer: torch.optim.Optimizer, named: str,
                       error: type[UserError]) -> None:
    """An optimizer whose step needs a closure (LBFGS: it evaluates the loss itself, again
    and again) cannot be stepped by fastsgd's loop, which computes the loss once a step."""
    try:
        inspect.signature(optimizer.step).bind()
    except TypeError:
        name = type(optimizer).__name__
        raise error(f"{named} makes {described(optimizer)}: {name} needs a closure, which "
                    "fastsgd's loop does not give; use another optimizer") from None
    except ValueError:
        pass  # no signature to read: it is stepped as it is


def _toml(value: Any) -> Any:
    """A TOML-writable copy of an optimizer default (tuples become lists), or None."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float)) for v in value):
        return list(value)
    return None
