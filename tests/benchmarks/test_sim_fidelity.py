"""benchmarks/sim_fidelity.py: a 2-host run completes on both hosts and in the simulator,
leaves nothing in the network stack (also when interrupted), and refuses where it cannot
make namespaces; benchmarks/tcp_exchange.py, its plain-socket counterpart, likewise."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from fastsgd.bench import netns
from tests.conftest import needs_namespaces, one_host_test_at_a_time, orphans

pytestmark = one_host_test_at_a_time

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "sim_fidelity.py"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



@pytest.mark.multiproc
@needs_namespaces
def test_two_hosts_allreduce_real_and_simulated(tmp_path: Path) -> None:
    out = tmp_path / "fidelity.json"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--workers", "2", "--strategies",
                             "allreduce", "--steps", "12", "--warmup", "3", "--json", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=240)
    assert netns.leftovers(f"fsgd{proc.pid}") == []
    assert proc.returncode == 0, stderr[-3000:]
    [row] = json.loads(out.read_text())["results"]
    assert row["real_ranks"] == row["simulated_ranks"] == 2  # both hosts logged their steps
    assert row["real_s_per_step"] > 0 and row["simulated_s_per_step"] > 0
    assert row["real_bytes_per_step"] == row["simulated_bytes_per_step"] > 0
    assert row["tcp_congestion_control"] == "reno"  # by default (--tcp)
    assert "TCP reno" in stdout  # the hosts' TCP, in the figures
    assert "allreduce" in stdout


@pytest.mark.multiproc
@needs_namespaces
def test_interrupted_run_removes_its_namespaces(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--workers", "2", "--strategies",
                             "allreduce", "--steps", "200", "--runs", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prefix = f"fsgd{proc.pid}"
    deadline = time.monotonic() + 60
    while len(netns.leftovers(prefix)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)  # wait for the bridge's and both hosts' namespaces
    assert len(netns.leftovers(prefix)) == 3
    time.sleep(3)  # into the real run
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert netns.leftovers(prefix) == []
    # torchrun's workers too: they run in sessions of their own, and outlived the run
    for _ in range(50):
        if not orphans(str(tmp_path)):
            break
        time.sleep(0.1)
    assert not orphans(str(tmp_path))


def test_refuses_without_ip_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no ip, no tc
    proc = subprocess.run([sys.executable, str(SCRIPT), "--workers", "2"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("sim_fidelity: ")


def test_refuses_when_not_root(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert _load("sim_fidelity").main(["--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err == "sim_fidelity: emulated hosts need root (network namespaces and tc)\n"


@needs_namespaces
def test_a_setting_the_hosts_refuse_is_one_line_and_leaves_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    setting = "net.ipv4.no_such_setting=1"
    handlers = {sig: signal.getsignal(sig) for sig in netns.SIGNALS}
    try:  # main() makes these signals exit through its clean-up
        assert _load("sim_fidelity").main(["--workers", "2", "--sysctl", setting]) == 2
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    err = capsys.readouterr().err
    assert err.startswith(f"sim_fidelity: cannot set {setting} in an emulated host: ")
    assert err.count("\n") == 1
    assert not netns.leftovers(f"fsgd{os.getpid()}")


TCP_EXCHANGE = BENCHMARKS / "tcp_exchange.py"


@pytest.mark.multiproc
@needs_namespaces
def test_plain_socket_exchange_on_two_hosts_reports_both_ways() -> None:
    proc = subprocess.Popen([sys.executable, str(TCP_EXCHANGE), "--hosts", "2", "--rounds", "5",
                             "--bytes", "20000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert netns.leftovers(f"fsgd{proc.pid}") == []
    assert "TCP reno" in stdout
    for way in ("together", "in-turn"):
        [line] = [line for line in stdout.splitlines() if line.startswith(way)]
        assert float(line.split(":")[1].split()[0]) > 0


def test_plain_socket_exchange_refuses_without_ip_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no ip, no tc
    proc = subprocess.run([sys.executable, str(TCP_EXCHANGE)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("tcp_exchange: ")
