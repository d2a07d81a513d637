"""Is the simulator right? The same job on real processes over emulated links, and simulated.

    sudo python3 benchmarks/sim_fidelity.py [--workers 2 3 4] [--strategies allreduce dpsgd
        sgp ps] [--bandwidth 20Mbit] [--steps 40] [--json FILE] [--check]
        [--sim-set compute.model=profile ...] [--tcp reno|bbr|machine]

The simulator's claims (who waits for whom, how long a message takes) are only worth what
its timing is worth, and that can be checked only against real links. Each emulated host is
a network namespace on this machine, on a bridge, its link limited to `--bandwidth` each way
by `tc tbf` (fastsgd/bench/netns.py); torchrun starts one node per namespace (gloo over the
namespace's veth). The simulator then runs the same job (same workers, steps, seed) with
`network.bandwidth` the same and `network.latency` half the round trip measured between two
namespaces. Time per step is the same statistic on both, from metrics.jsonl: per worker,
(time at the last step S - time at step K) / (S - K), K = --warmup, averaged over the
workers. The last step counts: asynchronous strategies (sgp, ps) do not wait for the network
during training, their messages queue, and the network's cost shows only in the final drain;
`s'` (up to step S-1) shows how fast they step meanwhile. The goal is agreement within 15%;
--check makes a larger difference exit 1. Needs root, `ip` and `tc`; refuses (exit 2)
otherwise. Everything made in the network stack is removed at the end, also on error or
on SIGINT/SIGTERM/SIGHUP. docs/multihost.md has the measured table and what explains it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fastsgd.bench.hosts import run_nodes
from fastsgd.bench.netns import EmulatedHosts, Refused, prepare_script
from fastsgd.records.rundir import cpu_name

GOAL = 0.15
STRATEGIES = ("allreduce", "dpsgd", "sgp", "ps")


def strategy_options(name: str, workers: int) -> list[str]:
    """What each strategy needs beyond its name (the same for the real and simulated run)."""
    if name == "dpsgd":
        return ["strategy.topology=ring"]
    if name == "ps":  # the server adds every worker's step: lr / n
        return [f"optimizer.lr={0.05 / workers:g}"]
    return []


def job_options(args: argparse.Namespace, name: str, workers: int, out: Path) -> list[str]:
    items = [f"strategy.name={name}", f"model.name={args.model}", f"data.name={args.data}",
             f"data.batch_size={args.batch}", f"run.steps={args.steps}", f"run.seed={args.seed}",
             "run.eval_every=0", "run.target_accuracy=0", f"run.workers={workers}",
             f"run.out={out}", *strategy_options(name, workers), *args.set]
    return [word for item in items for word in ("--set", item)]


def step_stats(metrics: Path, warmup: int) -> dict[str, float]:
    """Per step from metrics.jsonl, each worker's mean over steps warmup+1..S, averaged over
    the workers: seconds (`s_per_step`; also `s_per_step_before_drain`, up to step S-1),
    and bytes sent by all workers (`bytes_per_step`); `ranks`, the workers that logged."""
    by_rank: dict[int, dict[int, dict[str, Any]]] = {}
    for line in metrics.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_rank.setdefault(record["rank"], {})[record["step"]] = record
    full, before, sent = [], [], 0.0
    for steps in by_rank.values():
        last = max(steps)
        if last - warmup < 2:
            raise ValueError(f"{metrics}: too few steps after the warm-up of {warmup}")
        full.append((steps[last]["time"] - steps[warmup]["time"]) / (last - warmup))
        before.append((steps[last - 1]["time"] - steps[warmup]["time"]) / (last - 1 - warmup))
        sent += sum(steps[k]["bytes_sent"] for k in range(warmup + 1, last + 1)) / (last - warmup)
    return {"s_per_step": sum(full) / len(full), "ranks": len(by_rank),
            "s_per_step_before_drain": sum(before) / len(before), "bytes_per_step": sent}


class Children:
    """Processes started in their own session, so that an interrupt can end all of them."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    def end_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.procs = []


def run_real(args: argparse.Namespace, hosts: EmulatedHosts, options: list[str],
             folder: Path) -> None:
    """One torchrun node per namespace; raises RuntimeError with the log's tail on failure."""
    codes = run_nodes(hosts, 1, options, folder, args.timeout)
    if any(codes):
        tail = (folder / "node0.log").read_text()[-1500:]
        raise RuntimeError(f"real run failed (exit codes {codes}):\n{tail}")


def run_simulated(args: argparse.Namespace, options: list[str], network: list[str],
                  children: Children, folder: Path) -> None:
    sim = [word for item in [*network, *args.sim_set] for word in ("--set", item)]
    cmd = [sys.executable, "-m", "fastsgd", "simulate", "--quiet", *options, *sim]
    proc = children.start(cmd, folder / "simulate.log", {**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        code = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        code = -1
    finally:
        children.end_all()
    if code:
        tail = (folder / "simulate.log").read_text()[-1500:]
        raise RuntimeError(f"simulated run failed (exit code {code}):\n{tail}")


def measure(args: argparse.Namespace, hosts: EmulatedHosts, children: Children, name: str,
            latency: str, runs: Path) -> dict[str, Any]:
    """One (strategy, workers) pair: the real run, then the simulated one."""
    n = hosts.n
    row: dict[str, Any] = {"strategy": name, "workers": n}
    network = [f"network.bandwidth={args.bandwidth}", f"network.latency={latency}"]
    for mode in ("real", "simulated"):
        folder = runs / f"{name}-{n}-{mode}"
        folder.mkdir(parents=True, exist_ok=True)
        options = job_options(args, name, n, folder / "run")
        try:
            if mode == "real":
                run_real(args, hosts, options, folder)
            else:
                run_simulated(args, options, network, children, folder)
            stats = step_stats(folder / "run" / "metrics.jsonl", args.warmup)
        except (RuntimeError, ValueError, OSError) as e:
            print(f"{name}, {n} workers, {mode}: {e}", file=sys.stderr)
            row["error"] = f"{mode}: {str(e).splitlines()[0]}"
            return row
        row.update({f"{mode}_{key}": value for key, value in stats.items()})
    row["difference"] = row["simulated_s_per_step"] / row["real_s_per_step"] - 1
    return row


def run_all(args: argparse.Namespace, children: Children, runs: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rate = args.bandwidth.lower().replace("/s", "")  # tc: 20mbit = 20e6 bit/s, as fastsgd
    for n in args.workers:
        with EmulatedHosts(n, rate, args.burst, args.limit, args.mtu,
                           sysctls=tuple(args.sysctl),
                           tcp=None if args.tcp == "machine" else args.tcp) as hosts:
            rtt, tcp = hosts.round_trip(0, 1), hosts.congestion_control()
            latency = f"{rtt / 2 * 1e6:.0f}us"
            print(f"{n} hosts: {args.bandwidth} each way (tbf burst {args.burst}), TCP {tcp}, "
                  f"round trip {rtt * 1e6:.0f} us -> network.latency={latency}\n{HEADER}",
                  flush=True)
            for name in args.strategies:
                row = measure(args, hosts, children, name, latency, runs)
                rows.append({**row, "round_trip_s": rtt, "latency": latency,
                             "tcp_congestion_control": tcp})
                print(format_row(row), flush=True)
    return rows


def format_row(row: dict[str, Any]) -> str:
    head = f"{row['strategy']:<10} {row['workers']:>7}"
    if "error" in row:
        return f"{head}  failed: {row['error']}"
    seconds = [row[f"{mode}_{key}"] for key in ("s_per_step", "s_per_step_before_drain")
               for mode in ("real", "simulated")]
    return (f"{head} {seconds[0]:>8.4f} {seconds[1]:>8.4f} {row['difference']:>+7.1%}"
            f" {seconds[2]:>8.4f} {seconds[3]:>8.4f} {row['real_bytes_per_step'] / 1e6:>8.3f}"
            f" {row['simulated_bytes_per_step'] / 1e6:>8.3f}")


_COLUMNS = ("real s", "sim s", "diff", "real s'", "sim s'", "real MB", "sim MB")
HEADER = ("{:<10} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8}".format(
    "strategy", "workers", *_COLUMNS) + "\n(per step after the warm-up; s': up to the step "
    "before the last, where asynchronous strategies drain; MB: sent by all workers)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    p.add_argument("--bandwidth", default="20Mbit", help="each host's link, each way")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5, help="steps left out at the start")
    p.add_argument("--model", default="mlp")
    p.add_argument("--data", default="digits")
    p.add_argument("--batch", type=int, default=32, help="per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--burst", default="16kb", help="tc tbf burst of every link")
    p.add_argument("--limit", default="8mb", help="tc tbf queue of every link (bytes)")
    p.add_argument("--mtu", type=int, default=1500, help="of every link (9000: jumbo frames)")
    p.add_argument("--tcp", default="reno",
                   help="the hosts' TCP congestion control (machine: this machine's)")
    p.add_argument("--sysctl", action="append", default=[], metavar="KEY=VALUE",
                   help="set in every host's namespace (e.g. net.ipv4.tcp_slow_start_after_idle=0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a fastsgd key for both runs (repeatable)")
    p.add_argument("--sim-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a fastsgd key for the simulated run only, e.g. compute.model=profile")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--runs", default=None, help="keep the run directories here")
    p.add_argument("--json", default=None, help="write the results to this file")
    p.add_argument("--check", action="store_true", help=f"exit 1 beyond {GOAL:.0%}%")
    args = p.parse_args(argv)
    if min(args.workers) < 2 or args.steps < args.warmup + 3:
        p.error("need --workers >= 2 and --steps >= --warmup + 3")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    children = Children()
    if not prepare_script("sim_fidelity"):
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(args.runs or tmp)
        try:
            rows = run_all(args, children, runs)
        except Refused as e:  # e.g. a --sysctl the kernel does not take in a namespace
            print(f"sim_fidelity: {e}", file=sys.stderr)
            return 2
        finally:
            children.end_all()
    return report(args, rows)


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> int:
    print("\n" + HEADER)
    for row in rows:
        print(format_row(row))
    failed = [r for r in rows if "error" in r]
    off = [r for r in rows if abs(r.get("difference", 0)) > GOAL]
    print(f"{len(rows) - len(failed) - len(off)} of {len(rows)} within {GOAL:.0%}"
          + (f"; {len(failed)} failed" if failed else ""))
    if args.json:
        write_json(Path(args.json), args, rows)
    if failed:
        return 1
    return 1 if args.check and off else 0


def write_json(path: Path, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    settings = {key: getattr(args, key) for key in ("bandwidth", "burst", "limit", "mtu", "tcp",
                                                    "sysctl", "steps", "warmup", "set",
                                                    "sim_set")}
    meta = {"command": sys.argv, "machine": platform.platform(), "cpu": cpu_name(),
            "cpus": os.cpu_count(),
            "load_average_at_end": os.getloadavg(), **settings}
    path.write_text(json.dumps({**meta, "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
