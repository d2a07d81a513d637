"""Emulated hosts on one Linux machine: network namespaces joined through a bridge, each
host's link limited by `tc tbf` in both directions.

Why namespaces: a real multi-host run needs real links (their bandwidth, their queues, TCP
on top), which loopback between processes on one machine does not have. Each host here is a
namespace with its own stack; its veth's namespace end shapes what it sends (uplink), the
bridge end shapes what it receives (downlink). The bridge lives in a namespace of its own,
so everything this module creates sits in namespaces named PREFIX-*: deleting them removes
every veth, bridge and qdisc with them, and the root namespace is never touched.

    with EmulatedHosts(2, "20mbit") as hosts:
        subprocess.run(hosts.exec_prefix(0) + ["ip", "addr"])

Used by a bench's `mode = "hosts"` cells (bench/hosts.py) and benchmarks/sim_fidelity.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys

SUBNET = "10.239.0"  # inside the namespaces only: never routed in the root namespace
MAX_HOSTS = 253  # SUBNET.1 .. SUBNET.253 in one /24


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_on_signals(who: str) -> None:
    """Make SIGINT, SIGTERM and SIGHUP exit through the `finally` blocks and `with`
    statements in progress, so that EmulatedHosts.close runs; a second signal is ignored,
    so it cannot cut that cleanup short."""
    def interrupted(signum: int, frame: object) -> None:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        print(f"{who}: interrupted ({signal.Signals(signum).name}), cleaning up",
              file=sys.stderr)
        raise SystemExit(128 + signum)

    for sig in SIGNALS:
        signal.signal(sig, interrupted)


class Refused(Exception):
    """This machine cannot emulate hosts (not root, no ip/tc, namespaces refused)."""


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def check_can_emulate(prefix: str) -> None:
    """Raise Refused, with the reason in one line, where namespaces cannot be made."""
    if os.geteuid() != 0:
        raise Refused("emulated hosts need root (network namespaces and tc)")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise Refused(f"emulated hosts need {' and '.join(missing)} (iproute2) on PATH")
    probe = f"{prefix}-probe"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0:
        raise Refused(f"cannot create a network namespace: {proc.stderr.strip()}")
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=30)


def prepare_script(who: str) -> bool:
    """For a script that makes emulated hosts: False, once it has printed why in one line
    (`who: ...`), where this machine cannot; else True, with SIGINT, SIGTERM and SIGHUP
    made to exit through the clean-up (exit_on_signals)."""
    try:
        check_can_emulate(f"fsgd{os.getpid()}")
    except Refused as e:
        print(f"{who}: {e}", file=sys.stderr)
        return False
    exit_on_signals(who)
    return True


def leftovers(prefix: str) -> list[str]:
    """Namespaces and root-namespace links whose name starts with `prefix`."""
    found = []
    for args in (["netns", "list"], ["-o", "link"]):
        out = subprocess.run(["ip", *args], capture_output=True, text=True).stdout
        for line in out.splitlines():
            words = line.replace(":", " ").split()
            found += [w for w in words[:2] if w.startswith(prefix)]
    return found


def _kill_inside(namespace: str) -> None:
    try:
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                              text=True, timeout=30).stdout.split()
    except subprocess.TimeoutExpired:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def remove_stale(base: str = "fsgd") -> list[str]:
    """Delete the namespaces `base<PID>-*` whose process PID is gone (killed -9 before it
    could clean up), and what runs in them; returns their names."""
    stale = []
    for name in leftovers(base):
        pid = name[len(base):].split("-")[0]
        if "-" in name and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _kill_inside(name)
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
            stale.append(name)
    return stale


class EmulatedHosts:
    """`n` hosts 10.239.0.1..n on one bridge; every link `rate` (tc syntax, e.g. 20mbit;
    or a list, one per host) each way, token bucket `burst` bytes, queue `limit` bytes
    (large: no drops), `mtu`; `sysctls` ("net.ipv4.tcp_slow_start_after_idle=0", ...) set
    in every host, after `tcp`, the hosts' TCP congestion control (None: what a namespace
    takes from this machine).

    Reno by default: like the simulator's links, it sends as fast as the ACKs come back and
    takes at once what another flow leaves free. BBR (which paces at the rate it measured)
    and cubic's HyStart (which leaves slow start as the round trip grows) take these links'
    queueing delay, on a path of tens of microseconds, for congestion, and leave the links
    idle part of the time: gossip up to 30% slower (docs/multihost.md). Linux's default,
    cubic, is not allowed in a namespace unless net.ipv4.tcp_allowed_congestion_control
    names it, a setting of the whole machine."""

    def __init__(self, n: int, rate: str | list[str], burst: str = "16kb",
                 limit: str = "8mb", mtu: int = 1500, prefix: str | None = None,
                 sysctls: tuple[str, ...] = (), tcp: str | None = "reno"):
        self.n, self.burst, self.limit, self.mtu = n, burst, limit, mtu
        self.rates = [rate] * n if isinstance(rate, str) else list(rate)
        self.sysctls = (() if tcp is None else (f"net.ipv4.tcp_congestion_control={tcp}",)
                        ) + tuple(sysctls)
        self.prefix = prefix or f"fsgd{os.getpid()}"
        self.made: list[str] = []  # namespaces, in creation order

    def ns(self, i: int | str) -> str:
        return f"{self.prefix}-{'sw' if i == 'sw' else f'h{i}'}"

    def ifname(self, i: int) -> str:
        """The host's interface (inside its namespace): GLOO_SOCKET_IFNAME."""
        return f"{self.prefix}h{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    def __enter__(self) -> EmulatedHosts:
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        sw, bridge = self.ns("sw"), f"{self.prefix}br"
        self._add_namespace(sw)
        _ip("-n", sw, "link", "add", bridge, "type", "bridge")
        _ip("-n", sw, "link", "set", bridge, "up")
        for i in range(self.n):
            host, inside, outside = self.ns(i), self.ifname(i), f"{self.prefix}b{i}"
            self._add_namespace(host)
            _ip("link", "add", inside, "netns", host, "type", "veth",
                "peer", "name", outside, "netns", sw)
            _ip("-n", sw, "link", "set", outside, "mtu", str(self.mtu), "master", bridge)
            _ip("-n", sw, "link", "set", outside, "up")
            _ip("-n", host, "link", "set", inside, "mtu", str(self.mtu))
            _ip("-n", host, "addr", "add", f"{self.address(i)}/24", "dev", inside)
            _ip("-n", host, "link", "set", inside, "up")
            _ip("-n", host, "link", "set", "lo", "up")
            self._shape(host, inside, self.rates[i])  # uplink: what the host sends
            self._shape(sw, outside, self.rates[i])  # downlink: what the bridge hands it
            for setting in self.sysctls:
                proc = subprocess.run([*self.exec_prefix(i), "sysctl", "-q", "-w", setting],
                                      capture_output=True, text=True, timeout=30)
                if proc.returncode != 0:
                    raise Refused(f"cannot set {setting} in an emulated host: "
                                  f"{proc.stderr.strip()}")

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self.made.append(name)

    def _shape(self, ns: str, dev: str, rate: str) -> None:
        proc = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev,
                               "root", "tbf", "rate", rate, "burst", self.burst,
                               "limit", self.limit], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"tc tbf on {dev}: {proc.stderr.strip()}")

    def kill_all(self) -> None:
        """Kill every process in the hosts' namespaces (torchrun's workers run in sessions
        of their own, so killing a torchrun leaves them)."""
        for name in self.made:
            _kill_inside(name)

    def close(self) -> None:
        """Kill every process still in a namespace made, then delete the namespaces (their
        veths, bridge and qdiscs go with them). An interrupt waits until this is done: one
        that cut it short would leave namespaces nobody deletes."""
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            while self.made:
                name = self.made.pop()
                _kill_inside(name)
                subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def congestion_control(self) -> str:
        """The hosts' TCP congestion control (see the class's docstring)."""
        return subprocess.run([*self.exec_prefix(0), "sysctl", "-n",
                               "net.ipv4.tcp_congestion_control"], capture_output=True,
                              text=True, timeout=30).stdout.strip() or "unknown"

    def round_trip(self, a: int = 0, b: int = 1, trips: int = 50) -> float:
        """Median TCP round trip (s) of a 1-byte message from host a to host b and back."""
        server = subprocess.Popen([*self.exec_prefix(b), sys.executable, "-c", _ECHO,
                                   self.address(b)], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            server.stdout.readline()  # listening
            out = subprocess.run([*self.exec_prefix(a), sys.executable, "-c", _PING,
                                  self.address(b), str(trips)], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
        finally:
            server.kill()
            server.wait()
        return statistics.median(float(x) for x in out.split())


_ECHO = """import socket, sys
s = socket.create_server((sys.argv[1], 29400)); print("ready", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)): c.sendall(b)
"""
_PING = """import socket, sys, time
c = socket.create_connection((sys.argv[1], 29400))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); print(time.perf_counter() - t)
"""
