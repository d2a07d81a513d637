"""A bench cell on emulated hosts (`mode = "hosts"`): real processes on real TCP links,
on this one machine. Each node is a network namespace on a bridge, its link limited each
way by `tc tbf` to the cell's bandwidth (bench/netns.py), and torchrun starts the node's
workers there (gloo over the namespace's veth). This is the simulator's fidelity check
(benchmarks/sim_fidelity.py) as a cell, so one spec can put the same job on emulated links
and in the simulator side by side.

Of `[network]` it emulates `bandwidth` (each way), `bandwidths` (per worker, with one
worker per node), `workers_per_node` (the processes of one namespace, which talk over its
loopback) and `mtu`. Latency, jitter and loss would need `tc netem`: those keys must keep
their defaults (the links' own latency is tens of microseconds), and `[faults]`, which the
simulator alone plays, must be empty. Anything else is refused in one line naming the key.

    python3 -m fastsgd.bench.hosts CELL.toml --out RUN_DIR   # what a bench runs; needs root

An interrupt (SIGINT, SIGTERM, SIGHUP) kills the nodes and removes every namespace: the
cell is then not done, and the bench runs it again from its start.
"""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastsgd.bench.netns import (
    MAX_HOSTS,
    EmulatedHosts,
    Refused,
    check_can_emulate,
    exit_on_signals,
    remove_stale,
)
from fastsgd.config import schema as cfg
from fastsgd.config.units import parse_bandwidth, parse_seconds
from fastsgd.errors import ConfigError
from fastsgd.strategies import CHOICES
from fastsgd.transport.sim.network import Network

PORT = 29500  # each namespace has ports of its own: always free
LOG_TAIL = 3000  # characters of a failed node's log shown
GRACE = 10.0  # seconds the other nodes get to end once one has failed
MAX_MTU = 65535  # a veth's


def check_config(config: dict[str, Any]) -> None:
    """Refuse, in one line naming the key, what emulated hosts cannot emulate."""
    network, default = config["network"], cfg.defaults()["network"]
    for key in ("latency", "jitter", "intra_latency"):
        if parse_seconds(network[key], f"network.{key}") != parse_seconds(default[key]):
            _refuse(key, network[key], default[key], "would need tc netem")
    if parse_bandwidth(network["intra_bandwidth"]) != parse_bandwidth(
            default["intra_bandwidth"]):
        _refuse("intra_bandwidth", network["intra_bandwidth"], default["intra_bandwidth"],
                "is a namespace's loopback")
    if network["loss"]:
        _refuse("loss", network["loss"], 0.0, "would need tc netem")
    workers = config["run"]["workers"]
    as_simulated(config).check(workers)  # workers_per_node divides them, ranks exist
    if network["bandwidths"] and network["workers_per_node"] > 1:
        raise ConfigError("network.bandwidths: emulated hosts give one link per node; "
                          "per-worker links need network.workers_per_node = 1")
    if workers // network["workers_per_node"] > MAX_HOSTS:
        raise ConfigError(f"run.workers = {workers}: at most {MAX_HOSTS} emulated hosts "
                          "(raise network.workers_per_node)")
    if network["mtu"] > MAX_MTU:
        raise ConfigError(f"network.mtu = {network['mtu']}: a veth carries at most {MAX_MTU}")
    if config["run"]["backend"] == "nccl":
        raise ConfigError("run.backend = 'nccl': emulated hosts share this machine's GPUs "
                          "and NCCL would bypass their links; use gloo (or auto)")
    for key in ("crash", "down"):
        if config["faults"][key]:
            raise ConfigError(f"faults.{key}: the simulator's faults do not apply to mode "
                              "'hosts' cells; kill a real worker instead (benchmarks/soak.py)")


def _refuse(key: str, value: object, default: object, why: str) -> None:
    raise ConfigError(f"network.{key} = {value!r}: emulated hosts shape bandwidth only "
                      f"(tc tbf); this {why}. Leave it at {default!r} in mode 'hosts' cells")


def as_simulated(config: dict[str, Any]) -> Network:
    """The cell's `[network]` as the simulator reads it (one reading of the keys)."""
    keys = inspect.signature(Network.parse).parameters
    return Network.parse(**{k: v for k, v in config["network"].items() if k in keys})


def links(config: dict[str, Any]) -> list[int]:
    """Each node's link in bit/s: network.bandwidth, or the worker's own."""
    network = as_simulated(config)
    nodes = config["run"]["workers"] // network.workers_per_node
    return [round(network.nic(i) * 8) for i in range(nodes)]


def burst(bits_per_second: int) -> str:
    """tbf's bucket: 16 KiB, or 1 ms of the rate on fast links (tbf needs at least one
    timer tick's worth to reach its rate)."""
    return str(max(16384, bits_per_second // 8000))


def run_nodes(hosts: EmulatedHosts, per_node: int, fastsgd_args: list[str], logs: Path,
              timeout: float | None = None) -> list[int]:
    """`fastsgd run ARGS` under torchrun (on gloo), one node per host, `per_node` workers
    each; the nodes' exit codes (-1: past `timeout` seconds, or still running `GRACE`
    seconds after another node failed). Every node's log is logs/nodeI.log. Every process
    left in the hosts is killed at the end, whatever happens (torchrun's workers run in
    sessions of their own)."""
    procs: list[subprocess.Popen] = []
    try:
        for i in range(hosts.n):
            env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.ifname(i), "OMP_NUM_THREADS": "1"}
            cmd = [*hosts.exec_prefix(i), sys.executable, "-m", "torch.distributed.run",
                   f"--nnodes={hosts.n}", f"--nproc-per-node={per_node}", f"--node-rank={i}",
                   f"--master-addr={hosts.address(0)}", f"--master-port={PORT}",
                   "-m", "fastsgd", "run", "--quiet", *fastsgd_args,
                   "--set", "run.backend=gloo"]
            with open(logs / f"node{i}.log", "w") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, start_new_session=True))
        return _wait_all(procs, None if timeout is None else time.monotonic() + timeout)
    finally:
        hosts.kill_all()
        for proc in procs:
            proc.wait()


def _wait_all(procs: list[subprocess.Popen], deadline: float | None) -> list[int]:
    """Every node's exit code; once one fails, the others get GRACE seconds (a node whose
    peer died can wait in a collective for many minutes)."""
    while any(p.poll() is None for p in procs):
        if any(p.poll() for p in procs):
            failed = time.monotonic() + GRACE
            deadline = failed if deadline is None else min(deadline, failed)
        if deadline is not None and time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [-1 if p.poll() is None else p.returncode for p in procs]


def run_cell(spec: Path, out: Path) -> int:
    """Run the cell described by `spec` (a resolved configuration) into `out`; 0 when
    every node succeeded, 1 when one failed (its log is printed), 2 when this machine
    cannot emulate hosts or the configuration cannot be emulated."""
    config = cfg.load(CHOICES, spec)
    check_config(config)
    prefix = f"fsgd{os.getpid()}"
    check_can_emulate(prefix)
    remove_stale()  # what a cell killed -9 left
    rates = links(config)
    per_node = config["network"]["workers_per_node"]
    mtu = config["network"]["mtu"] or 1500  # 0 (payload only) is the simulator's
    args = [str(spec), "--overwrite", "--set", f"run.out={out}"]
    with EmulatedHosts(len(rates), [f"{r}bit" for r in rates], burst(max(rates)),
                       mtu=mtu, prefix=prefix) as hosts, tempfile.TemporaryDirectory() as tmp:
        print(f"{len(rates)} emulated hosts of {per_node} worker(s), links "
              f"{', '.join(f'{r / 1e6:g} Mbit/s' for r in sorted(set(rates)))} each way, "
              f"TCP {hosts.congestion_control()}", flush=True)
        codes = run_nodes(hosts, per_node, args, Path(tmp))
        for i, code in enumerate(codes):
            text = (Path(tmp) / f"node{i}.log").read_text()
            if i == 0 or code:
                print(f"--- node {i} (exit code {code})\n{text[-LOG_TAIL:]}", flush=True)
    return 0 if not any(codes) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", type=Path, help="the cell's configuration (TOML)")
    p.add_argument("--out", type=Path, required=True, help="its run directory")
    args = p.parse_args(argv)
    exit_on_signals("fastsgd.bench.hosts")
    try:
        return run_cell(args.spec, args.out)
    except (ConfigError, Refused) as e:
        print(f"fastsgd.bench.hosts: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:  # ip, tc, sysctl
        print(f"fastsgd.bench.hosts: emulated hosts failed: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
