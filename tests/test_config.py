import pytest

from fastsgd import config as cfg
from fastsgd.errors import ConfigError


def test_defaults_are_the_demo():
    c = cfg.load()
    assert (c["model"]["name"], c["data"]["name"], c["strategy"]["name"]) == (
        "lenet", "fashion_mnist", "allreduce")
    assert c["run"]["workers"] == 4 and c["strategy"]["bucket_mb"] == 25.0


def test_file_and_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\nworkers = 2\n[data]\nname = "digits"\n[network]\nlatency = "1ms"\n')
    c = cfg.load(path, ["run.workers=3", "optimizer.lr=0.1", "strategy.overlap=false"])
    assert c["run"]["workers"] == 3 and c["data"]["name"] == "digits"
    assert c["optimizer"]["lr"] == 0.1 and c["strategy"]["overlap"] is False
    assert c["run"]["epochs"] == 8.0  # ints are accepted where floats are expected


def test_written_config_reads_back_identical(tmp_path):
    c = cfg.load(None, ["run.out=runs/x", "data.path=/some/where"])
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml(c))
    assert cfg.load(path) == c


@pytest.mark.parametrize("override, culprit", [
    ("run.workers=0", "run.workers must be >= 1"),
    ("run.workers=-3", "run.workers"),
    ("run.workers=two", "run.workers must be of type int"),
    ("data.bach_size=3", "unknown config key 'data.bach_size' (did you mean data.batch_size?)"),
    ("optimizer.name=rmsprop", "optimizer.name must be sgd, adam or an import path"),
    ("strategy.name=gossipy", "unknown strategy 'gossipy' (strategy.name)"),
    ("strategy.bucket_mb=0", "strategy.bucket_mb must be > 0"),
    ("strategy.nope=1", "unknown config key 'strategy.nope'"),
    ("compression.name=zip", "unknown codec 'zip' (compression.name)"),
    ("runn.workers=2", "unknown config section [runn]"),
    ("noequals", "expected KEY=VALUE"),
])
def test_bad_values_name_the_key(override, culprit):
    with pytest.raises(ConfigError, match=None) as err:
        cfg.load(None, [override])
    assert culprit in str(err.value)


def test_malformed_toml_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[run\nworkers = 2\n")
    with pytest.raises(ConfigError, match=f"malformed TOML in {path}"):
        cfg.load(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        cfg.load(tmp_path / "nope.toml")
