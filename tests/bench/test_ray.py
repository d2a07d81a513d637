"""`fastsgd bench --ray`: cells as tasks of a Ray cluster (here a local instance of 2 CPUs),
their run directories shipped back to the driver; simulated cells give the bits of a local
bench."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastsgd.bench import run_bench

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray is not installed (pip install fastsgd[ray]; .ci/run installs it)",
                allow_module_level=True)

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


# Ray runs in a process of its own, never in the test's: ray.init leaves gRPC threads in
# its process after ray.shutdown, and a later test of the same pytest worker that forks
# (the launcher, a multiprocessing pool) got children that exited or hung on a lock (CI:
# test_many_processes_claim_distinct_folders never returned)
DRIVER = """
import sys
from pathlib import Path
import ray
from fastsgd.bench import run_bench
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
try:
    code = max(run_bench(Path(spec), Path(out), quiet=True, ray_address="auto")
               for spec, out in zip(sys.argv[1::2], sys.argv[2::2]))  # SPEC OUT pairs
finally:
    ray.shutdown()
sys.exit(code)
"""


def _env() -> dict[str, str]:
    """Ray's workers import fastsgd: from this checkout, as the tests do."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [src, os.environ.get("PYTHONPATH")]))}


@pytest.mark.multiproc
def test_ray_cells_are_the_bits_of_local_cells_and_share_one_profile(tmp_path):
    from fastsgd.config import schema as cfg
    from fastsgd.transport.sim.compute import TIMES

    spec, profiled = tmp_path / "sweep.toml", tmp_path / "profiled.toml"
    spec.write_text(SPEC)
    profiled.write_text(SPEC.replace('compute.model = "fixed"\ncompute.step_time = "2ms"\n', "")
                        .replace("run.steps = 30", "run.steps = 4"))
    driver = subprocess.run([sys.executable, "-c", DRIVER, str(spec), str(tmp_path / "ray"),
                             str(profiled), str(tmp_path / "ray-profiled")],
                            capture_output=True, text=True, env=_env(), timeout=600)
    assert driver.returncode == 0, driver.stderr[-3000:]
    computes = [cfg.read_toml(p)["compute"]
                for p in (tmp_path / "ray-profiled").glob("cells/*/config.toml")]
    assert len(computes) == 2
    assert len({tuple(c[k] for k in TIMES if k != "strategy") for c in computes}) == 1
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


def test_an_unreachable_ray_address_is_one_line(tmp_path):
    spec = tmp_path / "sweep.toml"
    spec.write_text(SPEC)
    bench = subprocess.run([sys.executable, "-m", "fastsgd", "bench", str(spec), "--ray",
                            "127.0.0.1:1", "--out", str(tmp_path / "b")],
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert bench.returncode == 2, bench.stderr
    assert bench.stderr.count("\n") == 1 and \
        "--ray 127.0.0.1:1: cannot reach a Ray cluster" in bench.stderr, bench.stderr
