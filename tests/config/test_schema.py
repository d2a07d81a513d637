import pytest

from fastsgd.config import schema as cfg
from fastsgd.config import toml_files
from fastsgd.errors import ConfigError
from fastsgd.strategies import CHOICES


def test_defaults_are_the_demo():
    c = cfg.load(CHOICES)
    assert (c["model"]["name"], c["data"]["name"], c["strategy"]["name"]) == (
        "lenet", "fashion_mnist", "allreduce")
    assert c["run"]["workers"] == 4 and c["strategy"]["bucket_mb"] == 25.0


def test_file_and_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\nworkers = 2\n[data]\nname = "digits"\n[network]\nlatency = "1ms"\n')
    c = cfg.load(CHOICES, path, ["run.workers=3", "optimizer.lr=0.1", "strategy.overlap=false"])
    assert c["run"]["workers"] == 3 and c["data"]["name"] == "digits"
    assert c["optimizer"]["lr"] == 0.1 and c["strategy"]["overlap"] is False
    assert c["run"]["epochs"] == 0.0  # the dataset's own


def test_written_config_reads_back_identical(tmp_path):
    c = cfg.load(CHOICES, None, ["run.out=runs/x", "data.path=/some/where"])
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml(c))
    assert cfg.load(CHOICES, path) == c


def test_a_key_written_outside_its_table_names_the_table(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("workers = 2\n")
    with pytest.raises(ConfigError, match=r"job.toml: unknown config section \[workers\] "
                                          r"\(workers is a key of \[run\]: write it under"):
        cfg.load(CHOICES, path)


def test_a_relative_or_home_data_path_is_made_absolute(tmp_path, monkeypatch):
    """From the config file's folder; `~` is the home folder, as in a shell."""
    monkeypatch.setenv("HOME", "/home/someone")
    raw = {"data": {"path": "corpus:~/more:/abs"}}
    cfg.paths_from(raw, tmp_path)
    assert raw["data"]["path"] == f"{tmp_path}/corpus:/home/someone/more:/abs"


@pytest.mark.parametrize("override, culprit", [
    ("run.workers=0", "run.workers must be >= 1"),
    ("run.workers=-3", "run.workers"),
    ("run.workers=two", "run.workers must be of type int"),
    ("data.bach_size=3", "unknown config key 'data.bach_size' (did you mean data.batch_size?)"),
    ("optimizer.name=rmsprop", "optimizer.name must be sgd, adam, adamw or an import path"),
    ("strategy.name=gossipy", "unknown strategy 'gossipy' (strategy.name)"),
    ("strategy.bucket_mb=0", "strategy.bucket_mb must be > 0"),
    ("strategy.nope=1", "unknown config key 'strategy.nope'"),
    ("compression.name=zip", "unknown codec 'zip' (compression.name)"),
    ("runn.workers=2", "unknown config section [runn]"),
    ("noequals", "expected KEY=VALUE"),
])
def test_bad_values_name_the_key(override, culprit):
    with pytest.raises(ConfigError, match=None) as err:
        cfg.load(CHOICES, None, [override])
    assert culprit in str(err.value)


def test_malformed_toml_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[run\nworkers = 2\n")
    with pytest.raises(ConfigError, match=f"malformed TOML in {path}"):
        cfg.load(CHOICES, path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        cfg.load(CHOICES, tmp_path / "nope.toml")


@pytest.mark.parametrize("content", [None, b"\xff\xfe[run]\x00\x9c"])
def test_a_config_that_is_no_text_file_names_the_file(tmp_path, content):
    path = tmp_path / "c.toml"
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"config file {path}"):
        cfg.load(CHOICES, path)


def test_an_unreadable_config_names_the_file(tmp_path, monkeypatch):
    def denied(path, mode):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(toml_files, "open", denied, raising=False)  # as root, chmod would not do
    with pytest.raises(ConfigError, match=f"cannot read config file {tmp_path}.*denied"):
        cfg.load(CHOICES, tmp_path / "c.toml")


@pytest.mark.parametrize("text", ["run = 5\n", "run = [1, 2]\n", "[[run]]\nworkers = 2\n"])
def test_a_section_that_is_not_a_table_names_it(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"c.toml: \[run\] must be a table"):
        cfg.load(CHOICES, path, ["run.workers=2"])


@pytest.mark.parametrize("override, culprit", [
    ("run.epochs=inf", "run.epochs must be a finite number"),
    ("run.epochs=nan", "run.epochs must be a finite number"),
    pytest.param("run.epochs=" + "9" * 400, "run.epochs must be a finite number", id="9" * 9),
    ("optimizer.lr=inf", "optimizer.lr must be a finite number"),
    ("strategy.bucket_mb=inf", "strategy.bucket_mb must be a finite number"),
    ("compute.sigma=inf", "compute.sigma must be a finite number"),
    ("compute.sigma=1e200", "compute.sigma must be in [0, 2]"),
    ("compute.straggler_factor=inf", "compute.straggler_factor must be a finite number"),
    ("compute.slowdown=[1, inf]", "compute.slowdown must hold only finite numbers"),
    # a phase's time times these must stay finite for the simulator's integer clock
    ("compute.slowdown=[1, 1e300]", "compute.slowdown must be a list of numbers from 1 to 1e+06"),
    ("compute.straggler_factor=1e300", "compute.straggler_factor must be in [1, 1000000.0]"),
    ('faults.crash=[{worker = 1, at = nan}]', "faults.crash must hold only finite numbers"),
    ("run.timeout=inf", "run.timeout must be a finite number"),
    ("run.timeout=1e12", "run.timeout must be > 0 and at most a week"),
    ("run.seed=99999999999999999999", "run.seed must be an integer from -2**63"),
    ("run.seed=-1", "run.seed must be in [0, 9223372036854775807]"),
    # the draws' own seeds: -1 is the run's
    ("compute.seed=99999999999999999999", "compute.seed must be an integer from -2**63"),
    ("network.seed=-5", "network.seed must be -1 (run.seed) or 0 to 2**63 - 1"),
    ("compute.profiled=[1]", "compute.profiled must be of type dict"),
    ('compute.profiled={a = {b = 1}}', "compute.profiled must be a table of what profile"),
])
def test_numbers_must_be_finite_and_in_range(override, culprit):
    with pytest.raises(ConfigError) as err:
        cfg.load(CHOICES, None, ["compute.straggler_prob=0.5", override])
    assert culprit in str(err.value)


def test_what_profile_wrote_reads_back_identical(tmp_path):
    """compute.profiled (profiling.py) is an inline table of scalars and lists."""
    written = {"model.name": "mlp", "data.batch_size": 32, "input_shape": [1, 8, 8],
               "optimizer.nesterov": False, "optimizer.momentum": 0.9, "forward": "216us"}
    c = cfg.merged(cfg.load(CHOICES), CHOICES, compute={"profiled": written})
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml(c))
    again = cfg.load(CHOICES, path)
    assert again == c and again["compute"]["profiled"] == written


def test_a_codec_seed_fits_64_bits():
    with pytest.raises(ConfigError, match="compression.seed must be an integer from -2"):
        cfg.load(CHOICES, None,
                 ["compression.name=powersgd", "compression.seed=99999999999999999999"])


def test_another_strategy_drops_the_keys_of_the_one_the_file_chose(tmp_path):
    path = tmp_path / "config.toml"  # a run's config: all of allreduce's and topk's options
    path.write_text(cfg.to_toml(cfg.load(CHOICES, None, ["compression.name=topk"])))
    c = cfg.load(CHOICES, path, ["strategy.name=dpsgd", "compression.name=qsgd"])
    assert c["strategy"]["name"] == "dpsgd" and "bucket_mb" not in c["strategy"]
    assert c["compression"]["name"] == "qsgd" and "ratio" not in c["compression"]
    # a key both know is the other one's too: allreduce's overlap (a bool) is not diloco's
    # (an int), nor is diloco's period localsgd's
    assert cfg.load(CHOICES, path, ["strategy.name=diloco"])["strategy"]["overlap"] == 0
    path.write_text(cfg.to_toml(cfg.load(CHOICES, None, ["strategy.name=diloco"])))
    assert cfg.load(CHOICES, path, ["strategy.name=localsgd"])["strategy"]["period"] == 8
    with pytest.raises(ConfigError, match="unknown config key 'strategy.bucket_mb'"):
        cfg.load(CHOICES, path, ["strategy.bucket_mb=3", "strategy.name=dpsgd"])  # given: checked
    path.write_text('[strategy]\nname = "dpsgd"\ntopolgy = "ring"\n')
    with pytest.raises(ConfigError, match="unknown config key 'strategy.topolgy'"):
        cfg.load(CHOICES, path, ["strategy.name=dpsgd"])  # the same choice: the file's typo fails
