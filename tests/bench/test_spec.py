"""A bench spec's mistakes: one line naming the spec file and the key, before any cell runs."""

import pytest

from fastsgd.bench import cells, load_spec
from fastsgd.errors import ConfigError

AXES = '[axes]\n"run.seed" = [1, 2]\n'


def _spec(tmp_path, text):
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("bench, says", [
    ('mdoe = "run"', "unknown config key 'bench.mdoe' (did you mean bench.mode?)"),
    ('mode = "ray"', "bench.mode must be one of simulate, run, hosts, got 'ray'"),
])
def test_the_bench_table_is_checked(tmp_path, bench, says):
    with pytest.raises(ConfigError) as err:
        load_spec(_spec(tmp_path, f"[bench]\n{bench}\n" + AXES))
    assert str(err.value).startswith(f"{tmp_path / 'sweep.toml'}: {says}")


@pytest.mark.parametrize("base", ["run = 5", "run = [1, 2]", "model = 5"])
def test_a_base_section_that_is_not_a_table_names_it(tmp_path, base):
    section = base.split()[0]
    with pytest.raises(ConfigError, match=rf"sweep.toml \[base\]: \[{section}\] must be a table"):
        cells(*load_spec(_spec(tmp_path, f"[base]\n{base}\n" + AXES)))
