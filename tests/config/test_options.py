"""Every type error shows the value the user gave: in the API, the TOML file and the CLI."""

import pytest

import fastsgd as fs
from fastsgd.config import schema as cfg
from fastsgd.config.options import Option, at_least, positive
from fastsgd.errors import ConfigError
from fastsgd.strategies import CHOICES


@pytest.mark.parametrize("kind, value, shown", [
    (int, "four", "got 'four' (str)"),
    (int, 2.5, "got 2.5 (float)"),
    (int, True, "got True (bool)"),
    (float, "two", "got 'two' (str)"),
    (float, None, "got None (NoneType)"),
    (str, 3, "got 3 (int)"),
    (bool, "yes", "got 'yes' (str)"),
    (bool, 1, "got 1 (int)"),
    (list, 3, "got 3 (int)"),
    (list, "1,1,3", "got '1,1,3' (str)"),
])
def test_type_errors_show_the_given_value(kind, value, shown):
    with pytest.raises(ConfigError) as err:
        Option(kind, kind()).validate("sec.key", value)
    assert str(err.value) == f"sec.key must be of type {kind.__name__}, {shown}"


def test_range_errors_show_the_given_value():
    with pytest.raises(ConfigError, match=r"run.epochs must be >= 0, got -2$"):
        cfg.load(CHOICES, None, ["run.epochs=-2"])


@pytest.mark.parametrize("override, shown", [
    ("run.workers=four", "run.workers must be of type int, got 'four'"),
    ("run.epochs=two", "run.epochs must be of type float, got 'two'"),
    ("compute.slowdown=3", "compute.slowdown must be of type list, got 3"),
    # a number where a unit is wanted: what such a value looks like
    ("network.latency=20", "network.latency must be a time >= 0 such as 20ms, 50us or 0.1s"),
    ("network.bandwidth=100", "network.bandwidth must be a bandwidth > 0 such as 100Mbit"),
])
def test_cli_overrides(override, shown):
    with pytest.raises(ConfigError, match=shown):
        cfg.load(CHOICES, None, [override])


def test_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\nworkers = "2"\n')
    with pytest.raises(ConfigError, match=r"run.workers must be of type int, got '2' \(str\)"):
        cfg.load(CHOICES, path)


def test_api(synthetic):
    job = fs.Job(model="mlp", data=synthetic, quiet=True, options={"run.steps": 1})
    with pytest.raises(ConfigError, match=r"run.workers must be of type int, got '2' \(str\)"):
        job.run(workers="2")


@pytest.mark.parametrize("kind, check, value, says", [
    (float, None, float("inf"), "sec.key must be a finite number, got inf"),
    (float, positive, float("inf"), "sec.key must be a finite number, got inf"),
    (float, at_least(0), float("nan"), "sec.key must be a finite number, got nan"),
    pytest.param(float, None, 10 ** 400, "sec.key must be a finite number", id="10**400"),
    (int, None, 2 ** 63, "sec.key must be an integer from -2**63 to 2**63 - 1"),
    (int, at_least(0), -2 ** 63 - 1, "sec.key must be an integer from -2**63 to 2**63 - 1"),
    (list, None, [1, [2, float("-inf")]], "sec.key must hold only finite numbers"),
    (dict, None, {"3": float("nan")}, "sec.key must hold only finite numbers"),
])
def test_numbers_are_finite_and_integers_fit_64_bits(kind, check, value, says):
    with pytest.raises(ConfigError) as err:
        Option(kind, kind(), check).validate("sec.key", value)
    assert str(err.value).startswith(says)

