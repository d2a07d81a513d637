"""A bench's `mode = "hosts"` cells: real processes on emulated links (network namespaces,
`tc tbf`), beside the simulator's cells of the same job; refused in one line for what
cannot be emulated, and nothing left in the network stack, also when interrupted."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fastsgd.bench import hosts, netns
from fastsgd.bench.runner import cell_dir, run_bench
from fastsgd.bench.spec import cells, load_spec
from fastsgd.cli.main import main
from fastsgd.errors import UserError
from tests.conftest import needs_namespaces, one_host_test_at_a_time, orphans

pytestmark = one_host_test_at_a_time

SPEC = """
[bench]
mode = "hosts"

[base]
data.name = "digits"
model.name = "mlp"
run.steps = 10
run.eval_every = 0
run.workers = 2
network.bandwidth = "20Mbit"
"""
BOTH = '[axes]\nmode = ["hosts", "simulate"]\n'



def _spec(tmp_path, text):
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def _by_rank(run_dir):
    ranks: dict[int, dict[int, dict]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        ranks.setdefault(record["rank"], {})[record["step"]] = record
    return ranks


def _fsgd_namespaces() -> list[str]:
    return [n for n in netns.leftovers("fsgd") if not n.startswith("fsgdtest")]


@pytest.mark.multiproc
@needs_namespaces
def test_a_hosts_cell_runs_on_links_of_the_cells_bandwidth(tmp_path):
    out = tmp_path / "b"
    spec = _spec(tmp_path, SPEC + BOTH)
    assert main(["bench", str(spec), "--out", str(out), "--quiet"]) == 0
    hosts, simulated = cells(*load_spec(spec))
    real, sim = _by_rank(cell_dir(out, hosts)), _by_rank(cell_dir(out, simulated))
    assert set(real) == set(sim) == {0, 1}
    for rank, steps in real.items():
        # the same job: the same bytes, step by step, on real links and in the simulator
        assert [s["bytes_sent"] for s in steps.values()] == \
               [s["bytes_sent"] for s in sim[rank].values()]
        # and the links were shaped: a step cannot beat its bytes through 20 Mbit/s
        sent = sum(steps[k]["bytes_sent"] for k in range(3, 11))
        assert steps[10]["time"] - steps[2]["time"] >= 0.9 * sent * 8 / 20e6
    summary = json.loads((cell_dir(out, hosts) / "summary.json").read_text())
    assert summary["workers"] == 2
    assert _fsgd_namespaces() == [] and not orphans(str(out))


@pytest.mark.multiproc
@needs_namespaces
def test_interrupting_a_hosts_cell_leaves_nothing(tmp_path):
    out = tmp_path / "b"
    spec = _spec(tmp_path, SPEC.replace("run.steps = 10", "run.steps = 400"))
    command = [sys.executable, "-m", "fastsgd", "bench", str(spec), "--out", str(out),
               "--quiet"]
    bench = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not list(out.glob("cells/*/metrics.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)  # the workers have started training on the emulated hosts
    assert _fsgd_namespaces(), "the hosts cell did not start"
    bench.send_signal(signal.SIGINT)
    _, err = bench.communicate(timeout=60)
    assert bench.returncode == 130, err
    for _ in range(50):
        if not orphans(str(out)):
            break
        time.sleep(0.1)
    assert not orphans(str(out)) and _fsgd_namespaces() == []
    assert not list(out.glob("cells/*/summary.json"))  # not done: a rerun starts it over


@pytest.mark.parametrize("extra,says", [
    ('network.latency = "20ms"\n', "network.latency = '20ms': emulated hosts shape "
                                   "bandwidth only (tc tbf); this would need tc netem"),
    ("network.loss = 0.01\n", "network.loss = 0.01"),
    ('network.intra_bandwidth = "1Gbit"\n', "network.intra_bandwidth = '1Gbit'"),
    ("network.workers_per_node = 3\n", "network.workers_per_node = 3 does not divide"),
    ('network.bandwidths = {5 = "1Mbit"}\n', "network.bandwidths names worker 5"),
    ('faults.crash = [{worker = 1, step = 3}]\n', "faults.crash: the simulator's faults"),
    ('run.backend = "nccl"\n', "run.backend = 'nccl': emulated hosts share"),
    ("run.workers = 300\n", "run.workers = 300: at most 253 emulated hosts"),
    ("network.mtu = 70000\n", "network.mtu = 70000: a veth carries at most 65535"),
])
def test_what_hosts_cannot_emulate_is_one_line(tmp_path, capsys, extra, says):
    base = SPEC.replace("run.workers = 2\n", "") if extra.startswith("run.workers") else SPEC
    assert main(["bench", str(_spec(tmp_path, base + extra)), "--out",
                 str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "the cell (the base)" in err, err
    assert not (tmp_path / "b" / "cells").exists()


def test_a_machine_that_cannot_make_namespaces_refuses_hosts_cells(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="mode 'hosts' cells cannot run here: emulated hosts "
                                        "need root"):
        run_bench(_spec(tmp_path, SPEC), tmp_path / "b")


def test_once_a_node_fails_the_others_get_a_grace_period(monkeypatch):
    monkeypatch.setattr(hosts, "GRACE", 0.5)
    procs = [subprocess.Popen(["sleep", "60"]), subprocess.Popen(["false"])]
    try:
        started = time.monotonic()
        assert hosts._wait_all(procs, None) == [-1, 1]
        assert time.monotonic() - started < 30
    finally:
        procs[0].kill()
        procs[0].wait()


@needs_namespaces
def test_namespaces_left_by_a_process_killed_9_are_removed():
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is free: as a hosts launcher killed -9 would leave it
    name = f"fsgd{gone.pid}-h0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in netns.remove_stale()
        assert name not in netns.leftovers("fsgd")
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
