"""`fastsgd bench --ray`: cells as tasks of a Ray cluster (here a local instance of 2 CPUs),
their run directories shipped back to the driver; simulated cells give the bits of a local
bench."""

import os
from pathlib import Path

import pytest

from fastsgd.bench import run_bench
from fastsgd.cli.main import main

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install fastsgd[ray]; "
                                        ".ci/run installs it)")

SPEC = """
[base]
data.name = "digits"
model.name = "mlp"
run.steps = 30
run.eval_every = 10
run.workers = 3
compute.model = "fixed"
compute.step_time = "2ms"
network.bandwidth = "100Mbit"

[axes]
"strategy.name" = ["dpsgd", "sgp"]
"""
SAME = ("model.pt", "metrics.jsonl", "eval.jsonl")


@pytest.fixture(scope="module")
def local_ray():
    # Ray's workers import fastsgd: from this checkout, as the tests do
    src = str(Path(__file__).resolve().parents[2] / "src")
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [src, before]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    if before is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = before


@pytest.mark.multiproc
def test_ray_cells_are_the_bits_of_local_cells(local_ray, tmp_path):
    spec = tmp_path / "sweep.toml"
    spec.write_text(SPEC)
    assert run_bench(spec, tmp_path / "ray", quiet=True, ray_address="auto") == 0
    assert run_bench(spec, tmp_path / "local", jobs=2, quiet=True) == 0
    ids = sorted(p.name for p in (tmp_path / "local" / "cells").iterdir() if p.is_dir())
    assert len(ids) == 2
    assert ids == sorted(p.name for p in (tmp_path / "ray" / "cells").iterdir() if p.is_dir())
    for cell in ids:
        for name in SAME:
            ray_file = tmp_path / "ray" / "cells" / cell / name
            assert ray_file.read_bytes() == (tmp_path / "local" / "cells" / cell / name
                                             ).read_bytes(), (cell, name)
    assert (tmp_path / "ray" / "report" / "report.html").is_file()


def test_an_unreachable_ray_address_is_one_line(tmp_path, capsys):
    spec = tmp_path / "sweep.toml"
    spec.write_text(SPEC)
    ray.shutdown()  # so that the bench must connect itself (any instance of this process
    # is gone: the test of the other cells uses its own, and has finished)
    assert main(["bench", str(spec), "--ray", "127.0.0.1:1", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray 127.0.0.1:1: cannot reach a Ray cluster" in err, err
