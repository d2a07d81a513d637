"""The pieces of a Job as config sections, and back.

`record` turns what the Python API was given (a model class, an optimizer factory, a
strategy object...) into the config keys that say what it is, so a run's config.toml
records what ran; the `*_from_config` functions rebuild each piece from those keys.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch

from fastsgd.compress import CODECS, check_codec_class
from fastsgd.config.objects import (
    WANTED,
    check_arguments,
    described,
    import_path,
    is_import_path,
    resolve,
    with_article,
)
from fastsgd.config.options import Configurable, Registry
from fastsgd.errors import ConfigError, UserError
from fastsgd.frameworks.base import model_loss_step
from fastsgd.loop.kit.optimizers import record_optimizer
from fastsgd.loop.plan import cross_entropy_step, evaluate_classifier
from fastsgd.strategies import STRATEGIES, check_strategy
from fastsgd.workloads.data import SEEDED_DATASETS
from fastsgd.workloads.dataset import Dataset

BUILTIN_FUNCTIONS = {"step": {"cross_entropy": cross_entropy_step, "model_loss": model_loss_step},
                     "evaluate": {"accuracy": evaluate_classifier}}
ARGUMENTS = {"step": 2, "evaluate": 3}  # (model, batch); (model, dataset, device)
EXAMPLES = {"strategy": "fs.AllReduce()", "compressor": "fs.compress.TopK(ratio=0.01)"}
BASES = {"strategy": "StrategyBase", "compressor": "Codec"}


def record(model: Any = None, step: Any = None, evaluate: Any = None, optimizer: Any = None,
           data: Any = None, strategy: Any = None, compressor: Any = None,
           seed: Any = 0) -> dict[str, dict]:
    """Config sections describing the objects given (strings are names, kept as they are);
    `seed` is the run's, which load_dataset uses."""
    sections: dict[str, dict] = {"model": {}}
    for key, arg in (("name", model), ("step", step), ("evaluate", evaluate)):
        if arg is not None:
            sections["model"][key] = _function_name(key, arg)
    if optimizer is not None:
        sections["optimizer"] = record_optimizer(optimizer)
    if isinstance(data, str):
        sections["data"] = {"name": data}
    elif isinstance(data, Dataset):
        sections["data"] = _record_dataset(data, seed)
    for section, arg, registry in (("strategy", strategy, STRATEGIES),
                                   ("compression", compressor, CODECS)):
        if arg is not None:
            sections[section] = _record_component(arg, registry)
    return sections


def _function_name(key: str, arg: Any) -> str:
    if isinstance(arg, str):
        return arg
    if isinstance(arg, torch.nn.Module):
        return f"<instance of {import_path(type(arg))}>"
    names = {fn: name for name, fn in BUILTIN_FUNCTIONS.get(key, {}).items()}
    return names.get(arg) or import_path(arg)


def _record_dataset(data: Dataset, seed: Any) -> dict[str, Any]:
    """Its loader's name and path, if loading them again at the run's seed gives it back."""
    if data.source is None or data.source[2] != seed and data.source[0] in SEEDED_DATASETS:
        return {"name": f"<Dataset '{data.name}' built in Python>"}
    return {"name": data.source[0], "path": data.source[1]}


def _record_component(obj: Any, registry: Registry) -> dict[str, Any]:
    """A strategy's or codec's section: its name (or import path) and the options it runs
    with, once the object keeps the contract its class would if the config named it."""
    if isinstance(obj, str):
        return {"name": obj}
    argument = "strategy" if registry is STRATEGIES else "compressor"
    if isinstance(obj, type) or not any(callable(getattr(obj, m, None))
                                        for m in WANTED[f"{registry.section}.name"][1]):
        got = f"the class {obj.__name__} (call it)" if isinstance(obj, type) else described(obj)
        raise UserError(f"{argument} must be a name or a {argument} instance such as "
                        f"{EXAMPLES[argument]}; got {got}")
    check_strategy(obj) if registry is STRATEGIES else check_codec_class(type(obj))
    name = getattr(obj, "name", None)
    if registry.classes.get(name) is not type(obj):
        name = import_path(type(obj))
    return {"name": name, **_running_options(obj, argument, registry.section)}


def _running_options(obj: Any, argument: str, section: str) -> dict[str, Any]:
    """The options `obj` runs with: a Configurable's checked constructor arguments; else,
    for each option its class declares, the object's attribute of that name. UserError where
    one cannot be read: config.toml would record the default, not what ran."""
    if isinstance(obj, Configurable):
        return obj.options
    schema = getattr(type(obj), "OPTIONS", {})
    missing = [key for key in schema if not hasattr(obj, key)]
    if missing:
        raise UserError(f"the {argument} argument, {described(obj)} ({import_path(type(obj))}"
                        f"), is not a fastsgd.Configurable and has no attribute {missing[0]!r} "
                        f"for its option {section}.{missing[0]}, so config.toml cannot record "
                        f"what it runs with: subclass fastsgd.{BASES[argument]}, or keep each "
                        "option in an attribute of its name")
    return {key: getattr(obj, key) for key in schema}


def function_from_config(key: str, value: str) -> Callable[..., Any]:
    """[model] step or evaluate: a built-in name or an import path."""
    builtin = BUILTIN_FUNCTIONS[key].get(value)
    if builtin is not None:
        return builtin
    fn = resolve(value, f"model.{key}")
    check_arguments(fn, ARGUMENTS[key], f"model.{key} = '{value}' does not take {ARGUMENTS[key]}"
                    f" arguments; it must name {WANTED[f'model.{key}'][0]}", ConfigError)
    return fn


def function_argument(key: str, fn: Any) -> Callable[..., Any] | None:
    """The API's step or evaluate argument, its signature checked as an import path's is;
    None for a name (the config's key then names it)."""
    if fn is None or isinstance(fn, str):
        return None
    if not callable(fn):
        raise UserError(f"{key} must be a name or {WANTED[f'model.{key}'][0]}; got "
                        f"{described(fn)}")
    check_arguments(fn, ARGUMENTS[key], f"the {key} argument {import_path(fn)} does not take "
                    f"{ARGUMENTS[key]} arguments; it must be {WANTED[f'model.{key}'][0]}")
    return fn


def model_factory(value: str) -> Callable[[], torch.nn.Module] | None:
    """[model] name as a zero-argument factory; None for a built-in model's name."""
    if not is_import_path(value):
        return None
    return _checked_factory(resolve(value, "model.name"), f"model.name = '{value}'", "name")


def _checked_factory(factory: Callable[[], Any], named: str,
                     verb: str) -> Callable[[], torch.nn.Module]:
    """`factory`, wrapped to say in one line where it does not make a model, unless it is a
    framework's model (JAX's: Job looks at its attributes), which checks itself."""
    if hasattr(factory, "check_data"):
        return factory
    return functools.partial(_made_model, factory, named, verb)  # picklable, unlike a closure


def _made_model(factory: Callable[[], Any], named: str, verb: str) -> torch.nn.Module:
    try:
        model = factory()
    except TypeError as e:  # it wants arguments
        raise ConfigError(f"{named}: {e}; it must {verb} {WANTED['model.name'][0]}") from None
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{named} made {described(model)}, not a torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{named} made a {type(model).__name__} without parameters to train")
    return model


def model_argument(model: Any) -> Callable[[], torch.nn.Module] | None:
    """The API's model argument as a factory: an instance is copied for each worker."""
    if isinstance(model, torch.nn.Module):
        if not hasattr(model, "check_data") and not any(p.requires_grad
                                                        for p in model.parameters()):
            raise UserError(f"the model argument ({with_article(type(model).__name__)}) has no "
                            "parameters to train: it has none, or all are frozen")
        return lambda: copy.deepcopy(model)
    if model is None or isinstance(model, str):
        return None
    if not callable(model):
        raise UserError(f"model must be a name, an nn.Module class or a zero-argument "
                        f"function returning one, or an nn.Module; got {type(model).__name__}")
    return _checked_factory(model, f"the model argument {import_path(model)}", "be")
