"""The worked examples of docs/extending.md (examples/my_*.py) as a user runs them: named
`module:Class` on the command line, trained on real processes (2 workers) and in the
simulator, recorded by name and options in config.toml, in the report and in TensorBoard;
the strategy and the codec pass the conformance suite."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastsgd.config.toml_files import read_toml
from fastsgd.records.tensorboard import PREFIX
from fastsgd.testing import check_codec, check_strategy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))  # as a user's own modules, beside their config

from my_codec import TwoBit  # noqa: E402
from my_strategy import Sparta  # noqa: E402

STEPS = 20
# (what the example sets, what config.toml then holds, what the report's table shows)
CASES = {
    "strategy": (["strategy.name=my_strategy:Sparta", "strategy.fraction=0.1"],
                 {"strategy": {"name": "my_strategy:Sparta", "fraction": 0.1, "seed": 0}},
                 "my_strategy:Sparta / none"),
    "codec": (["compression.name=my_codec:TwoBit"],
              {"compression": {"name": "my_codec:TwoBit", "error_feedback": True}},
              "allreduce / my_codec:TwoBit"),
    "model": (["model.name=my_model:TinyConv"], {"model": {"name": "my_model:TinyConv"}},
              "allreduce / none"),
    "dataset": (["data.name=my_dataset:spirals", "model.name=mlp"],
                {"data": {"name": "my_dataset:spirals"}}, "allreduce / none"),
}


def _fastsgd(command: str, out: Path, sets: list[str]) -> subprocess.CompletedProcess:
    base = ["data.name=digits", "model.name=mlp", "run.workers=2", f"run.steps={STEPS}",
            "run.eval_every=10", f"run.out={out}"]
    args = [a for s in [*base, *sets] for a in ("--set", s)]
    return subprocess.run([sys.executable, "-m", "fastsgd", command, "--quiet", *args],
                          cwd=EXAMPLES, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _tensorboard_records(path: Path) -> int:
    data, count, at = path.read_bytes(), 0, 0
    while at < len(data):
        at += 8 + 4 + int.from_bytes(data[at:at + 8], "little") + 4
        count += 1
    assert at == len(data)
    return count


@pytest.mark.parametrize("command", [pytest.param("run", marks=pytest.mark.multiproc),
                                     "simulate"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_example_runs_as_module_class_and_is_recorded(case, command, tmp_path):
    sets, recorded, label = CASES[case]
    out = tmp_path / "run"
    done = _fastsgd(command, out, sets)
    assert done.returncode == 0, done.stderr[-3000:]
    config = read_toml(out / "config.toml")
    for section, keys in recorded.items():
        assert {k: config[section][k] for k in keys} == keys
    assert f"| {label} | 2 |" in (out / "report" / "report.md").read_text()
    events = list(out.glob(PREFIX + "*"))
    # the header, then loss, lr, bytes sent and received and staleness per rank and step,
    # and accuracy, its loss and the consensus per evaluation
    assert len(events) == 1
    assert _tensorboard_records(events[0]) == 1 + 5 * 2 * STEPS + 4 * (STEPS // 10)


@pytest.mark.multiproc
def test_the_example_strategy_conforms(tmp_path):
    assert check_strategy(Sparta, real=True, out=tmp_path, fraction=0.1) == [
        "determinism", "resume", "drain", "real equals simulated"]


@pytest.mark.multiproc
def test_the_example_codec_conforms(tmp_path):
    assert check_codec(TwoBit, real=True, out=tmp_path) == [
        "contract", "determinism", "resume", "drain", "real equals simulated"]
