"""Is it TCP or fastsgd? A gossip round on a ring of emulated hosts with plain sockets.

    sudo python3 benchmarks/tcp_exchange.py [--hosts 3] [--tcp reno] [--rounds 20]
        [--bytes 340000] [--bandwidth 20mbit]

Each host sends `--bytes` to each of its two ring neighbours and receives theirs, round
after round, with nothing else running: no torch, no fastsgd. It measures what the links and
the hosts' TCP give, to set against fastsgd's dpsgd on the same links
(benchmarks/sim_fidelity.py) and the simulator's fluid model, 2 x bytes / bandwidth per
round. Two ways to send: `together` (a thread per neighbour, as fastsgd's messenger does)
and `in-turn` (one thread, the next neighbour once the first message is written). Per
round: the mean over rounds 4 on, per host. The hosts are fastsgd's emulated hosts
(bench/netns.py): needs root, `ip` and `tc`, refuses otherwise in one line (exit 2), and
removes every namespace it made, also on failure or interrupt. docs/multihost.md has the
figures (2026-12-01).
"""

from __future__ import annotations

import argparse
import selectors
import socket
import subprocess
import sys
import threading
import time

from fastsgd.bench.netns import EmulatedHosts, prepare_script

PORT = 6100  # each namespace has its own ports
SKIP = 3  # rounds left out of the mean: the connections' slow start
FRAME, HEADERS = 1514, 66  # bytes of an Ethernet frame at MTU 1500, and of its headers


def connect_ring(rank: int, n: int, address) -> dict[int, socket.socket]:
    """A connection to each ring neighbour: the lower rank listens, the higher connects."""
    peers = sorted({(rank + 1) % n, (rank - 1) % n} - {rank})
    listener = socket.create_server((address(rank), PORT))
    socks: dict[int, socket.socket] = {}
    for peer in [p for p in peers if p > rank]:
        for _ in range(600):
            try:
                socks[peer] = socket.create_connection((address(peer), PORT))
                break
            except OSError:
                time.sleep(0.05)
        socks[peer].sendall(bytes([rank]))
    for _ in [p for p in peers if p < rank]:
        sock, _ = listener.accept()
        socks[sock.recv(1)[0]] = sock
    listener.close()
    for sock in socks.values():
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return socks


def host(rank: int, n: int, way: str, rounds: int, size: int) -> None:
    """One host's rounds; prints its mean seconds per round."""
    socks = connect_ring(rank, n, lambda i: f"10.239.0.{i + 1}")
    # on 2 hosts both neighbours are the same host: two messages on one connection
    outgoing = [(rank + 1) % n, (rank - 1) % n]
    expect = {peer: size * outgoing.count(peer) for peer in socks}
    got = dict.fromkeys(socks, 0)
    arrived = threading.Condition()

    def read() -> None:
        selector, buffer = selectors.DefaultSelector(), bytearray(1 << 20)
        for peer, sock in socks.items():
            selector.register(sock, selectors.EVENT_READ, peer)
        while any(got[p] < rounds * expect[p] for p in socks):
            for key, _ in selector.select():
                count = key.fileobj.recv_into(buffer)
                with arrived:
                    got[key.data] += count
                    arrived.notify_all()

    threading.Thread(target=read, daemon=True).start()
    payload, times = bytes(size), []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        if way == "together":
            senders = [threading.Thread(target=socks[d].sendall, args=(payload,))
                       for d in outgoing]
        else:
            senders = [threading.Thread(target=lambda: [socks[d].sendall(payload)
                                                        for d in outgoing])]
        for sender in senders:
            sender.start()
        with arrived:
            arrived.wait_for(lambda r=r: all(got[p] >= r * expect[p] for p in socks))
        for sender in senders:
            sender.join()
        times.append(time.perf_counter() - start)
    print(f"{sum(times[SKIP:]) / len(times[SKIP:]):.4f}", flush=True)


def run(args: argparse.Namespace) -> int:
    fluid = 2 * args.bytes * 8 / float(args.bandwidth.lower().removesuffix("mbit")) / 1e6
    framed = fluid * FRAME / (FRAME - HEADERS)  # what tbf counts: whole Ethernet frames
    tcp = None if args.tcp == "machine" else args.tcp
    with EmulatedHosts(args.hosts, args.bandwidth, tcp=tcp) as hosts:
        print(f"{args.hosts} hosts, {args.bandwidth} each way, TCP "
              f"{hosts.congestion_control()}; {args.bytes} bytes to each ring neighbour, "
              f"{args.rounds} rounds; fluid model {fluid:.4f} s per round, {framed:.4f} with "
              f"Ethernet framing (as the simulator's network.mtu = 1500)")
        for way in args.ways:
            procs = [subprocess.Popen([*hosts.exec_prefix(i), sys.executable, __file__,
                                       "--host", str(i), str(args.hosts), way,
                                       str(args.rounds), str(args.bytes)],
                                      stdout=subprocess.PIPE, text=True)
                     for i in range(args.hosts)]
            means = [float(p.communicate(timeout=600)[0]) for p in procs]
            if any(p.returncode for p in procs):
                print(f"tcp_exchange: a host failed ({way})", file=sys.stderr)
                return 1
            print(f"{way:<9} s per round: {sum(means) / len(means):.4f} (hosts "
                  f"{' '.join(f'{m:.4f}' for m in means)})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--tcp", default="reno", help="the hosts' congestion control (machine: "
                   "what a namespace takes from this machine)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--bytes", type=int, default=340_000, help="per message (dpsgd's MLP)")
    p.add_argument("--bandwidth", default="20mbit", help="each host's link, each way (Mbit)")
    p.add_argument("--ways", nargs="+", default=["together", "in-turn"],
                   choices=["together", "in-turn"])
    p.add_argument("--host", nargs=5, help=argparse.SUPPRESS)  # a child: one host's rounds
    args = p.parse_args(argv)
    if args.host:
        rank, n, way, rounds, size = args.host
        host(int(rank), int(n), way, int(rounds), int(size))
        return 0
    if args.hosts < 2 or args.rounds <= SKIP or not args.bandwidth.lower().endswith("mbit"):
        p.error(f"need --hosts >= 2, --rounds > {SKIP} and --bandwidth in mbit")
    if not prepare_script("tcp_exchange"):
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
