"""compute.model = 'profile': the times it writes say what they were measured for
(compute.profiled); a re-run of config.toml that would change them profiles again, one that
would not repeats them; a time set by hand is refused, not silently measured over."""

import pytest

from fastsgd import Job
from fastsgd.config import schema as cfg
from fastsgd.errors import ConfigError
from fastsgd.loop.profiling import KEYS
from fastsgd.strategies import CHOICES
from fastsgd.transport.sim.compute import TIMES

SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 4,
         "run.eval_every": 0, "data.batch_size": 16}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A profiled run's config.toml."""
    out = tmp_path_factory.mktemp("profiled") / "run"
    Job(options={**SMALL, "run.out": str(out)}, quiet=True).simulate()
    return out / "config.toml"


def _again(config, out, capsys, **options) -> dict:
    """Simulate `config` with `options`; its [compute] section and what it said on stderr."""
    capsys.readouterr()
    result = Job(config=config, options={**options, "run.out": str(out)}, quiet=True).simulate()
    return {**cfg.load(CHOICES, result.run_dir / "config.toml")["compute"],
            "said": capsys.readouterr().err}


def test_the_profile_writes_what_it_measured_for(profiled):
    compute = cfg.load(CHOICES, profiled)["compute"]
    written = compute["profiled"]
    assert (written["model.name"], written["data.batch_size"], written["compression.name"],
            written["dtype"]) == ("mlp", 16, "none", "float32")
    assert "optimizer.lr" not in written and written["strategy.name"] == "allreduce"
    assert all(written[k] == compute[k] != "" for k in TIMES)


def test_another_strategy_measures_only_its_own_round(profiled, tmp_path, capsys):
    """So strategies are compared on the same forward, backward and update: only
    compute.strategy (its own work, an outer step here) is measured again, without a word."""
    again = _again(profiled, tmp_path / "b", capsys, **{"strategy.name": "diloco",
                                                       "strategy.period": 2})
    written = cfg.load(CHOICES, profiled)["compute"]
    assert again["said"] == ""
    assert {k: again[k] for k in TIMES if k != "strategy"} == {
        k: written[k] for k in TIMES if k != "strategy"}
    assert again["strategy"] != "0us" and again["profiled"]["strategy"] == again["strategy"]
    assert again["profiled"]["strategy.name"] == "diloco"
    assert again["profiled"]["strategy.period"] == 2


@pytest.mark.parametrize("options", [{"run.workers": 3},
                                     {"run.seed": 4, "optimizer.lr": 0.1}])
def test_what_does_not_change_the_times_keeps_them(options, profiled, tmp_path, capsys):
    again = _again(profiled, tmp_path / "b", capsys, **options)
    assert again["said"] == ""
    written = cfg.load(CHOICES, profiled)["compute"]
    assert {k: again[k] for k in KEYS} == {k: written[k] for k in KEYS}


@pytest.mark.parametrize("options, named", [
    ({"data.batch_size": 64}, "data.batch_size = 16, this run has 64"),
    ({"model.name": "lenet", "data.name": "synthetic"}, "model.name = 'mlp', this run has 'lenet'"),
])
def test_what_changes_the_times_profiles_again(options, named, profiled, tmp_path, capsys):
    again = _again(profiled, tmp_path / "b", capsys, **options)
    assert again["said"] == (f"fastsgd: compute.profiled: the times were measured for {named}; "
                             "profiling again\n")
    assert all(again["profiled"][k] == again[k] for k in TIMES)
    assert all(again["profiled"][k] == v for k, v in options.items())


def test_another_codec_measures_only_its_own_encode_and_decode(profiled, tmp_path, capsys):
    """Codecs are compared on the same forward, backward and update, as strategies are."""
    again = _again(profiled, tmp_path / "b", capsys, **{"compression.name": "topk"})
    written = cfg.load(CHOICES, profiled)["compute"]
    assert again["said"] == ""
    same = ("forward", "backward", "update", "reduce_bandwidth")
    assert {k: again[k] for k in same} == {k: written[k] for k in same}
    assert written["codec"] == "0us" and again["codec"] != "0us"  # timed now
    assert all(again["profiled"][k] == again[k] for k in TIMES)
    assert again["profiled"]["compression.name"] == "topk"


@pytest.mark.parametrize("options", [{"compute.forward": "1ms"},
                                     {"compute.reduce_bandwidth": "1GB"}])
def test_a_time_set_by_hand_under_profile_is_refused(options, profiled, tmp_path, capsys):
    key = next(iter(options))
    message = f"^{key} = '{options[key]}' is not a time profile measured"
    with pytest.raises(ConfigError, match=message):
        _again(profiled, tmp_path / "b", capsys, **options)
    with pytest.raises(ConfigError, match=message):  # a fresh job's too
        Job(options={**SMALL, **options, "run.out": str(tmp_path / "c")}).simulate()
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_an_edited_time_in_the_file_is_refused(profiled, tmp_path, capsys):
    text = profiled.read_text()
    forward = cfg.load(CHOICES, profiled)["compute"]["forward"]
    edited = tmp_path / "edited.toml"
    edited.write_text(text.replace(f'\nforward = "{forward}"', '\nforward = "9ms"'))
    with pytest.raises(ConfigError, match="^compute.forward = '9ms' is not a time profile"):
        _again(edited, tmp_path / "b", capsys)


def test_a_cleared_time_profiles_again(profiled, tmp_path, capsys):
    again = _again(profiled, tmp_path / "b", capsys, **{"compute.codec": ""})
    assert again["codec"] == "0us" and all(again["profiled"][k] == again[k] for k in TIMES)


def test_fixed_charges_the_profiled_times_or_a_step_time(profiled, tmp_path, capsys):
    """Under fixed, the profile's times are the user's to charge; step_time beside them
    replaces the profile's forward and backward (not the user's: test_sim_input)."""
    written = cfg.load(CHOICES, profiled)["compute"]
    frozen = _again(profiled, tmp_path / "b", capsys, **{"compute.model": "fixed"})
    assert {k: frozen[k] for k in KEYS} == {k: written[k] for k in KEYS}
    stepped = _again(profiled, tmp_path / "c", capsys, **{"compute.model": "fixed",
                                                         "compute.step_time": "3ms"})
    assert stepped["step_time"] == "3ms" and stepped["said"] == ""


def test_a_config_written_before_profiled_charges_its_times(profiled, tmp_path, capsys):
    old = tmp_path / "old.toml"
    old.write_text("\n".join(line for line in profiled.read_text().splitlines()
                             if not line.startswith("profiled = ")))
    again = _again(old, tmp_path / "b", capsys)
    written = cfg.load(CHOICES, profiled)["compute"]
    assert again["profiled"] == {} and all(again[k] == written[k] for k in TIMES)
