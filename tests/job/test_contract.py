"""A plugin as the job sees it when it starts: an import path that names nothing usable, an
unknown name, and an object given to the API, recorded in config.toml with the options it
runs with, or refused (loop/components.py, config/objects.py, config/options.py)."""

import pytest

import fastsgd as fs
from fastsgd.config import schema as cfg
from fastsgd.config.options import Option, between
from fastsgd.errors import ConfigError, UserError
from fastsgd.strategies import CHOICES

SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 2}


class Averages:
    """A plain (not Configurable) strategy: averages a `fraction` of steps' parameters."""

    name = "averages"
    OPTIONS = {"fraction": Option(float, 0.005, between(0, 1), "share of steps averaged")}

    def __init__(self, fraction: float = 0.005):
        self.fraction = fraction

    def init(self, params, ctx):
        return {}

    def on_gradients(self, params, state, ctx):
        return None

    def on_parameters(self, params, state, ctx):
        if ctx.last_step:
            for p in params:
                ctx.transport.all_reduce(p.data, average=True)

    def close(self):
        return None


class Hides(Averages):
    """Keeps its option under another name: what it runs with cannot be read."""

    def __init__(self, fraction: float = 0.005):
        self.share = fraction


def test_a_plain_object_is_recorded_with_the_options_it_runs_with(tmp_path):
    result = fs.Job(options={**SMALL, "run.out": str(tmp_path / "run")},
                    strategy=Averages(fraction=0.01), quiet=True).simulate()
    recorded = cfg.load(CHOICES, result.run_dir / "config.toml")["strategy"]
    assert recorded == {"name": f"{__name__}:Averages", "fraction": 0.01}


def test_a_plain_object_whose_options_cannot_be_read_is_refused():
    with pytest.raises(UserError) as err:
        fs.Job(options=SMALL, strategy=Hides(fraction=0.01), quiet=True)
    assert str(err.value) == (
        f"the strategy argument, a Hides ({__name__}:Hides), is not a fastsgd.Configurable "
        "and has no attribute 'fraction' for its option strategy.fraction, so config.toml "
        "cannot record what it runs with: subclass fastsgd.StrategyBase, or keep each option "
        "in an attribute of its name")


@pytest.mark.parametrize("value, message", [
    ("no_such_module:Sparta", "strategy.name = 'no_such_module:Sparta': cannot import "
                              "no_such_module (No module named 'no_such_module')"),
    (f"{__name__}:Nothing", f"strategy.name = '{__name__}:Nothing': {__name__} has no Nothing"),
    (f"{__name__}:SMALL", f"strategy.name = '{__name__}:SMALL' names a dict; it must name a "
                          "strategy class"),
    ("os:getcwd", "strategy.name = 'os:getcwd' names a function; it must name a strategy "
                  "class (with init, on_gradients, on_parameters, close)"),
])
def test_an_import_path_that_names_no_class_is_one_line(value, message):
    with pytest.raises(ConfigError) as err:
        fs.Job(options={**SMALL, "strategy.name": value}, quiet=True)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("key, value, message", [
    ("strategy.name", "allreduse", "unknown strategy 'allreduse' (strategy.name) (did you mean "
                                   "'allreduce'?); choose one of: adpsgd, allreduce,"),
    ("compression.name", "zip", "unknown codec 'zip' (compression.name); choose one of: bf16,"),
])
def test_an_unknown_name_lists_the_builtins_and_says_how_to_load_your_own(key, value, message):
    with pytest.raises(ConfigError) as err:
        fs.Job(options={**SMALL, key: value}, quiet=True)
    assert str(err.value).startswith(message)
    assert str(err.value).endswith(f", or name your own class as {key} = \"module:Class\" "
                                   "(docs/extending.md)")


def test_the_extension_api_is_exported():
    from fastsgd.compress.base import Codec
    from fastsgd.config.options import Configurable
    from fastsgd.strategies.base import StrategyBase
    from fastsgd.strategies.capabilities import Capabilities

    assert (fs.StrategyBase, fs.Capabilities, fs.Codec, fs.Configurable, fs.Option) == (
        StrategyBase, Capabilities, Codec, Configurable, Option)
    assert issubclass(fs.StrategyBase, fs.Configurable) and issubclass(fs.Codec, fs.Configurable)
