"""experiments/compare.py: a bench that is not one of a method and a deployment is one
line, and a summary's null (tokens have no bits per byte) is a dash, not a crash."""

import importlib.util
import json
from pathlib import Path

import pytest

from fastsgd.report.runs import RunData

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare", EXPERIMENTS / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(root, labels):
    (root / "cells").mkdir(parents=True)
    (root / "cells" / "labels.json").write_text(json.dumps(labels))
    for cell in labels:
        (root / "cells" / cell).mkdir()
        (root / "cells" / cell / "summary.json").write_text("{}")
    return root


@pytest.mark.parametrize("labels, says", [
    ({"a1": "method=allreduce run.workers=4"}, "its cells have no deployment axis (cell a1: "),
    ({"a1": "strategy.name=dpsgd"}, "its cells have no method or deployment axis"),
    ({"a1": "(the base)"}, "its cells have no method or deployment axis"),
    (None, "not a bench directory (no cells/labels.json)"),
])
def test_a_bench_without_its_two_axes_is_one_line(compare, tmp_path, capsys, labels, says):
    bench = _bench(tmp_path / "b", labels) if labels else tmp_path
    assert compare.main([str(bench), "--baseline", "allreduce"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"compare.py: error: {bench}: {says}")


def _run(**summary):
    base = {"strategy": "allreduce", "compressor": "none", "workers": 2, "steps": 10,
            "final_loss": 2.0, "final_bits_per_byte": 2.9, "bytes_sent_total": 1000,
            "time_to_target": None, "simulated_time": 1.0, "wall_time": 3.0,
            "mode": "simulated"}
    metrics = [{"rank": r, "forward": 0.01, "backward": 0.02, "update": 0.0} for r in (0, 1)]
    return RunData(Path("r"), {**base, **summary}, {}, metrics, [], {})


def test_a_null_in_a_summary_is_a_dash(compare):
    base = _run()
    assert compare.row("allreduce", base, base)[1:4] == ["2.000", "2.90", "+0.0%"]
    tokens = _run(final_bits_per_byte=None, final_loss=2.2)  # data.name = "tokens"
    assert compare.row("diloco", tokens, base)[1:4] == ["2.200", "-", "+10.0%"]
    diverged = _run(final_bits_per_byte=None, final_loss=None)
    assert compare.row("diloco", diverged, base)[1:4] == ["-", "-", "-"]
