"""The strategy contract (strategies/contract.py): each mistake in a strategy class ends the
job when it starts, in one line naming the class (module:Class) and the mistake, whether the
config names the class or the Python API is given an instance; no run folder is made."""

import pytest
import torch

import fastsgd as fs
from fastsgd.config.objects import import_path
from fastsgd.config.options import Option, at_least
from fastsgd.errors import ConfigError, UserError
from fastsgd.strategies import capabilities_of, check_strategy_class, hook

SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 2}
HERE = __name__


class Plain:
    """A strategy as a plain class (no StrategyBase), the old flags included: it works."""

    name, OPTIONS = "plain", {}
    CODEC_KINDS = ("exact", "quantize")
    DRAINS_AT_END = True

    def init(self, params, ctx):
        return {}

    def on_gradients(self, params, state, ctx):
        for p in params:
            ctx.transport.all_reduce(p.grad, average=True)

    def on_parameters(self, params, state, ctx):
        return None

    def close(self):
        return None


class Based(fs.StrategyBase):
    name = "based"
    OPTIONS = {"period": Option(int, 2, at_least(1), "steps between averages")}

    def __init__(self, period: int = 2):
        self.period = period

    def init(self, params, ctx):
        return {}

    def on_gradients(self, params, state, ctx):
        return None

    def on_parameters(self, params, state, ctx):
        if ctx.step % self.period == 0 or ctx.last_step:
            for p in params:
                ctx.transport.all_reduce(p.data, average=True)


class NoName(fs.StrategyBase):
    def init(self, params, ctx):
        return {}

    def on_gradients(self, params, state, ctx):
        return None

    def on_parameters(self, params, state, ctx):
        return None


class NumberName(Plain):
    name = 5


class NoClose:
    name = "no_close"

    def init(self, params, ctx):
        return {}

    def on_gradients(self, params, state, ctx):
        return None

    def on_parameters(self, params, state, ctx):
        return None


class NoGradients(Plain):
    on_gradients = None


class Abstract(fs.StrategyBase):
    name = "abstract"

    def init(self, params, ctx):
        return {}

    def on_gradients(self, params, state, ctx):
        return None


class Undeclared(Plain):
    def __init__(self, fraction: float = 0.1):
        self.fraction = fraction


class Unused(Based):
    OPTIONS = {**Based.OPTIONS, "seed": Option(int, 0)}


class OptionsList(Plain):
    OPTIONS = ["period"]


class OptionNotOption(Plain):
    OPTIONS = {"period": 4}


class BadDefault(Based):
    OPTIONS = {"period": Option(int, 0, at_least(1))}


class CarriesOnString(Plain):
    CARRIES_ON = "exact"


class DrainsYes(Plain):
    DRAINS_AT_END = "yes"


class UnknownKind(Based):
    capabilities = fs.Capabilities(codec_kinds=("exact", "dense"))


class CapabilitiesString(Based):
    capabilities = fs.Capabilities(carries_on="exact")


class CapabilitiesDict(Based):
    capabilities = {"drains_at_end": True}


class OldFlagToo(Based):
    DRAINS_AT_END = True


class HalfInFlight(Based):
    def in_flight_state(self):
        return {}


class SettleFlag(Plain):
    settle = True


@pytest.mark.parametrize("cls, mistake", [
    (NoName, "has no name: give it a class attribute name = \"...\""),
    (torch.nn.Linear, "has none of a strategy's methods (init, on_gradients, on_parameters, "
                      "close): it is not one"),
    (NumberName, "has name = an int: it must be a class attribute, a non-empty str"),
    (NoClose, "lacks close(), which fastsgd calls"),
    (NoGradients, "lacks on_gradients(params, state, ctx), which fastsgd calls"),
    (Abstract, "lacks on_parameters(params, state, ctx), which fastsgd calls"),
    (Undeclared, "takes 'fraction' in __init__, which its OPTIONS do not declare"),
    (Unused, "declares the option 'seed' in OPTIONS, which its __init__ does not take"),
    (OptionsList, "has OPTIONS = a list: it must be a dict of option name: fastsgd.Option"),
    (OptionNotOption, "has OPTIONS['period'] = an int: it must be a fastsgd.Option"),
    (BadDefault, "has an OPTIONS default that fails its own check: period must be >= 1"),
    (CarriesOnString, "has CARRIES_ON = 'exact': it must be a tuple of codec kinds"),
    (DrainsYes, "has DRAINS_AT_END = 'yes' (a str): it must be True or False"),
    (UnknownKind, "has capabilities.codec_kinds = ('exact', 'dense'): 'dense' is not a codec "
                  "kind (exact, quantize, sparse, lowrank)"),
    (CapabilitiesString, "has capabilities.carries_on = 'exact': it must be a tuple"),
    (CapabilitiesDict, "has capabilities = {'drains_at_end': True}: it must be a "
                       "fastsgd.Capabilities"),
    (OldFlagToo, "sets DRAINS_AT_END beside its capabilities, which fastsgd reads alone"),
    (HalfInFlight, "defines in_flight_state without load_in_flight(saved)"),
    (SettleFlag, "has settle that is not a method: it must be def settle(params, state, ctx)"),
])
def test_a_broken_strategy_class_named_in_the_config_is_one_line(cls, mistake, tmp_path):
    path = import_path(cls)  # torch.nn:Linear, or this module's
    with pytest.raises(ConfigError) as err:
        fs.Job(options={**SMALL, "strategy.name": path, "run.out": str(tmp_path / "run")},
               quiet=True)
    assert str(err.value).startswith(f"strategy class {path} {mistake}")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def _instance(cls):
    """An object of `cls`, made without its __init__."""
    return object.__new__(cls)


@pytest.mark.parametrize("cls, mistake", [
    (NoName, "has no name"), (NoClose, "lacks close()"), (NoGradients, "lacks on_gradients"),
    (Undeclared, "takes 'fraction' in __init__"), (DrainsYes, "has DRAINS_AT_END = 'yes'")])
def test_a_broken_strategy_object_given_to_the_api_is_one_line(cls, mistake):
    with pytest.raises(ConfigError, match=f"^strategy class {HERE}:{cls.__name__} {mistake}"):
        fs.Job(options=SMALL, strategy=_instance(cls), quiet=True)


def test_an_instance_whose_options_change_its_capabilities_is_checked_too():
    based = Based()
    based.capabilities = fs.Capabilities(rejoins="exact")
    with pytest.raises(ConfigError, match=f"^strategy class {HERE}:Based has "
                                          r"capabilities.rejoins = 'exact'"):
        fs.Job(options=SMALL, strategy=based, quiet=True)


def test_a_codec_the_strategy_does_not_declare_is_refused_before_training(tmp_path):
    """The default codec_kinds is exact only: a strategy that says nothing is not labelled
    with a codec it ignores."""
    job = fs.Job(options={**SMALL, "run.out": str(tmp_path / "run")}, strategy=Based(),
                 compressor="topk", quiet=True)
    with pytest.raises(UserError) as err:
        job.simulate()
    assert str(err.value) == (
        f"compression.name = 'topk' (sparse) does not apply to strategy.name = '{HERE}:Based',"
        " which takes exact codecs; declare the kinds its messages carry in "
        "capabilities.codec_kinds")
    assert not (tmp_path / "run").exists()


class RefusesFP16(Based):
    capabilities = fs.Capabilities(codec_kinds=("exact", "quantize"), refused_codecs=("fp16",))


def test_a_refused_codec_is_one_line(tmp_path):
    job = fs.Job(options=SMALL, strategy=RefusesFP16(), compressor="fp16", quiet=True)
    with pytest.raises(UserError, match=f"^compression.name = 'fp16' does not apply to "
                                        f"strategy.name = '{HERE}:RefusesFP16', which refuses "
                                        r"it \(capabilities.refused_codecs\)$"):
        job.simulate()


def test_a_plain_class_with_the_old_flags_still_runs_and_is_read_alike(tmp_path):
    capabilities = capabilities_of(Plain)
    assert capabilities.codec_kinds == ("exact", "quantize") and capabilities.drains_at_end
    assert capabilities.carries_on == () and capabilities.checkpoints  # the defaults
    result = fs.Job(options={**SMALL, "run.out": str(tmp_path / "run")}, strategy=Plain(),
                    compressor="fp16", quiet=True).simulate()
    assert result.summary["steps"] == 2


def test_hooks_are_the_strategys_own_or_none():
    from fastsgd.strategies import STRATEGIES

    assert hook(STRATEGIES.build({"name": "ps"}), "settle") is not None
    assert hook(Based(), "settle") is None  # StrategyBase's default: nothing to do
    assert hook(Plain(), "donate") is None  # a plain class without one
    with pytest.raises(ValueError, match="'setle' is not a strategy hook"):
        hook(Based(), "setle")


def test_every_builtin_keeps_the_contract():
    from fastsgd.strategies import STRATEGIES

    for name in STRATEGIES:
        check_strategy_class(STRATEGIES.get(name))
        assert isinstance(STRATEGIES.get(name).capabilities, fs.Capabilities)


def test_replica_checks_the_users_object_too():
    from fastsgd.transport.sim import simulate

    def worker(t):
        fs.Replica(torch.nn.Linear(2, 2), t, _instance(NoClose))

    with pytest.raises(ConfigError, match=f"^strategy class {HERE}:NoClose lacks close"):
        simulate(1, worker)
