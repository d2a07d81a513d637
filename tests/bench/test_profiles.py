"""Cells of one bench that run the same workload (model, data, batch, accumulate,
precision, optimizer) are charged one profile of compute, measured once, so that their
strategies and codecs are compared on the same forward, backward and update
(bench/profiles.py)."""

import pytest

from fastsgd.bench import cells, load_spec
from fastsgd.bench.profiles import workload_of
from fastsgd.cli.main import main
from fastsgd.config import schema as cfg
from fastsgd.transport.sim.compute import TIMES

SPEC = """
[base]
data.name = "digits"
model.name = "mlp"
run.steps = 4
run.eval_every = 0
run.workers = 2
data.batch_size = 16

[axes]
"strategy.name" = {strategies}
"""
SHARED = [k for k in TIMES if k not in ("strategy", "codec")]  # each cell times its own


def _spec(tmp_path, strategies, extra=""):
    path = tmp_path / "sweep.toml"
    path.write_text(SPEC.format(strategies=strategies) + extra)
    return path


def _times(out):
    """Each cell's [compute] times, by strategy."""
    found = {}
    for path in out.glob("cells/*/config.toml"):
        config = cfg.read_toml(path)
        found[config["strategy"]["name"]] = config["compute"]
    return found


def test_cells_are_grouped_by_their_workload(tmp_path):
    extra = ('"data.batch_size" = [16, 32]\n"run.seed" = [1, 2]\n'
             '"compression.name" = ["none", "topk"]\n'
             'compute = [{model = "profile"}, {model = "fixed", step_time = "2ms"}]\n')
    matrix = cells(*load_spec(_spec(tmp_path, '["allreduce", "localsgd"]', extra)))
    keys = [workload_of(c) for c in matrix]
    fixed = [k for c, k in zip(matrix, keys) if c.config["compute"]["model"] == "fixed"]
    assert fixed == [None] * 16  # they measure nothing
    groups = {k for k in keys if k is not None}
    assert len(groups) == 2  # by batch size; strategy, codec and seed aside
    by_batch = {c.config["data"]["batch_size"]: k for c, k in zip(matrix, keys) if k}
    assert by_batch[16] != by_batch[32]


@pytest.mark.multiproc
def test_the_cells_of_one_workload_share_one_profile(tmp_path):
    """allreduce and localsgd on the same job: the same forward, backward, update and
    reduce_bandwidth (each its own strategy round and codec); a cell added later, as the
    bench is run again with a longer axis, takes them from a cell done before."""
    out = tmp_path / "b"
    spec = _spec(tmp_path, '["allreduce", "localsgd"]')
    assert main(["bench", str(spec), "--out", str(out), "--jobs", "2", "--quiet"]) == 0
    times = _times(out)
    assert {k: times["allreduce"][k] for k in SHARED} == {
        k: times["localsgd"][k] for k in SHARED}
    assert times["localsgd"]["profiled"]["strategy.name"] == "localsgd"
    spec = _spec(tmp_path, '["allreduce", "localsgd", "easgd"]')
    assert main(["bench", str(spec), "--out", str(out), "--quiet"]) == 0
    again = _times(out)
    assert {k: again["easgd"][k] for k in SHARED} == {k: times["allreduce"][k] for k in SHARED}
    logs = "".join(p.read_text() for p in out.glob("cells/*.log"))
    assert len(list(out.glob("cells/*.log"))) == 3 and "profiling again" not in logs
