"""The simulated network: full-duplex NICs, nodes, per-worker bandwidths, loss."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastsgd.config.units import parse_bandwidth, parse_seconds
from fastsgd.errors import ConfigError

__all__ = ["Cost", "Network", "parse_bandwidth", "parse_seconds"]
TCP_IP_HEADERS = 52  # bytes of each frame that are not payload: IPv4 20, TCP 20 + 12 options
FRAME_OVERHEAD = TCP_IP_HEADERS + 14  # and the Ethernet header

@dataclass(frozen=True)
class Network:
    """The simulated cluster's links (docs/simulator.md has every formula).

    Each worker has a full-duplex NIC of `bandwidth` bytes/s each way (`bandwidths`
    overrides it per rank): what it sends leaves one message after another at its uplink
    rate; what it receives comes in one after another at its downlink rate. Workers are
    grouped `workers_per_node` to a node; between workers of one node messages take
    `intra_latency` and `intra_bandwidth` instead. A message between nodes is lost with
    probability `loss`: a reliable one (TCP) is sent again after `rto`, a droppable one
    (an asynchronous strategy's, see docs/strategies.md) is gone; `jitter` delays it by up
    to that much more (uniform). Inside a node nothing is lost or jittered. Collectives are
    priced among the ranks that take part (after a loss: the survivors), on their NICs and
    nodes.
    """

    bandwidth: float = 10e9 / 8
    latency: float = 50e-6
    jitter: float = 0.0
    seed: int = 0
    workers_per_node: int = 1
    intra_bandwidth: float = 100e9 / 8
    intra_latency: float = 2e-6
    bandwidths: tuple[tuple[int, float], ...] = ()  # (rank, bytes/s) overrides
    loss: float = 0.0
    rto: float = 0.2
    mtu: int = 1500  # Ethernet frames between nodes; 0 = count the payload only

    @classmethod
    def parse(cls, bandwidth: str | float = "10Gbit", latency: str | float = "50us",
              jitter: str | float = 0.0, seed: int = 0, workers_per_node: int = 1,
              intra_bandwidth: str | float = "100Gbit", intra_latency: str | float = "2us",
              bandwidths: dict | None = None, loss: float = 0.0,
              rto: str | float = "200ms", mtu: int = 1500) -> Network:
        overrides = tuple(sorted((_rank(k), parse_bandwidth(v, f"network.bandwidths.{k}"))
                                 for k, v in (bandwidths or {}).items()))
        if not 0 <= loss < 1:
            raise ConfigError(f"network.loss must be in [0, 1), got {loss!r}")
        return cls(parse_bandwidth(bandwidth), parse_seconds(latency),
                   parse_seconds(jitter, "network.jitter"), seed, workers_per_node,
                   parse_bandwidth(intra_bandwidth, "network.intra_bandwidth"),
                   parse_seconds(intra_latency, "network.intra_latency"), overrides,
                   float(loss), parse_seconds(rto, "network.rto"), mtu)

    def check(self, world_size: int) -> None:
        """Errors that depend on the number of workers."""
        if world_size % self.workers_per_node:
            raise ConfigError(f"network.workers_per_node = {self.workers_per_node} does not "
                              f"divide the {world_size} workers (run.workers)")
        for rank, _ in self.bandwidths:
            if rank >= world_size:
                raise ConfigError(f"network.bandwidths names worker {rank}, but ranks go "
                                  f"from 0 to {world_size - 1}")

    def nic(self, rank: int) -> float:
        """Worker `rank`'s bandwidth each way (bytes/s)."""
        for r, b in self.bandwidths:
            if r == rank:
                return b
        return self.bandwidth

    def same_node(self, a: int, b: int) -> bool:
        return a // self.workers_per_node == b // self.workers_per_node

    def wire(self, size: float) -> float:
        """Bytes a `size`-byte message takes on a link between nodes: every Ethernet frame
        of at most `mtu` bytes carries 52 bytes of TCP/IPv4 headers (with timestamps) and
        14 of Ethernet header besides its payload (what tc and NIC counters count)."""
        if not self.mtu:
            return size
        return size + math.ceil(size / (self.mtu - TCP_IP_HEADERS)) * FRAME_OVERHEAD

    def message_time(self, size: int) -> float:
        """Seconds for one message of `size` bytes between nodes, on idle links."""
        return self.latency + self.wire(size) / self.bandwidth

    def nodes(self, ranks: Sequence[int]) -> list[int]:
        """How many of `ranks` (in rank order) each node holds, for nodes that hold any."""
        counts: dict[int, int] = {}
        for r in ranks:
            counts[r // self.workers_per_node] = counts.get(r // self.workers_per_node, 0) + 1
        return list(counts.values())

    def collective(self, kind: str, size: int, ranks: Sequence[int],
                   nic: Callable[[int], float] | None = None, root: int | None = None) -> Cost:
        """A collective of `kind` ("allreduce", "allgather", "broadcast" from `root`, by
        default the lowest rank) among `ranks`, in rank order, on idle links; `nic(rank)`:
        each one's bandwidth (default: `bandwidth`, `bandwidths`)."""
        if len(ranks) <= 1:
            return Cost(0.0)
        slowest = min(map(nic or self.nic, ranks))
        if kind == "allreduce":
            return self._allreduce(size, ranks, slowest)
        if kind == "allgather":
            return self._allgather(size, ranks, slowest)
        if kind == "broadcast":
            return self._broadcast(size, ranks, slowest, ranks[0] if root is None else root)
        raise ValueError(f"unknown collective {kind!r}")

    def allreduce_time(self, size: int, ranks: int | Sequence[int]) -> float:
        """Seconds of an all-reduce among `ranks` (n: ranks 0..n-1), on idle links."""
        return self.collective("allreduce", size, _ranks(ranks)).seconds

    def allgather_time(self, size: int, ranks: int | Sequence[int]) -> float:
        return self.collective("allgather", size, _ranks(ranks)).seconds

    def broadcast_time(self, size: int, ranks: int | Sequence[int]) -> float:
        return self.collective("broadcast", size, _ranks(ranks)).seconds

    def _ring(self, size: float, n: int, bandwidth: float, latency: float) -> float:
        return 0.0 if n <= 1 else 2 * (n - 1) * (latency + self.wire(size / n) / bandwidth)

    def _allreduce(self, size: int, ranks: Sequence[int], slowest: float) -> Cost:
        """Ring all-reduce 2(n-1)/n*S/B + 2(n-1)*L at the slowest NIC's B; over m nodes,
        hierarchical: a pipelined reduce inside each node (S/B_i + (g-1)*L_i, g the most
        workers a node holds; none if every node holds one), a ring across the nodes
        (2(m-1)/m*S/B + 2(m-1)*L), a pipelined broadcast inside each node (as the reduce).
        Only the ring's rounds cross nodes: 2(m-1) of them, m messages each."""
        nodes = self.nodes(ranks)
        m, g = len(nodes), max(nodes)
        inside = 0.0 if g == 1 else size / self.intra_bandwidth + (g - 1) * self.intra_latency
        ring = self._ring(size, m, slowest, self.latency)
        return Cost(2 * inside + ring, ((2 * (m - 1), m),) if m > 1 else ())

    def _allgather(self, size: int, ranks: Sequence[int], slowest: float) -> Cost:
        """Ring all-gather of one `size`-byte tensor per worker: (n-1)*(L + S/B) at the
        slowest NIC if the ring spans m > 1 nodes (m of its n links cross nodes), else
        (n-1)*(L_i + S/B_i)."""
        n, m = len(ranks), len(self.nodes(ranks))
        if m == 1:
            return Cost((n - 1) * (self.intra_latency + size / self.intra_bandwidth))
        return Cost((n - 1) * (self.latency + self.wire(size) / slowest), ((n - 1, m),))

    def _broadcast(self, size: int, ranks: Sequence[int], slowest: float, root: int) -> Cost:
        """A binomial tree from `root` over the ranks in order from it: ceil(log2 n) rounds
        of one message each way; round k, 2^k messages at most. A round with a message
        between nodes takes L + S/B, one within nodes L_i + S/B_i."""
        at = list(ranks).index(root)
        order = [*ranks[at:], *ranks[:at]]
        crossing: list[tuple[int, int]] = []
        span, within = 1, 0
        while span < len(order):
            between = sum(not self.same_node(order[i], order[i + span])
                          for i in range(min(span, len(order) - span)))
            if between:
                crossing.append((1, between))
            within += not between
            span *= 2
        seconds = (len(crossing) * (self.latency + self.wire(size) / slowest)
                   + within * (self.intra_latency + size / self.intra_bandwidth))
        return Cost(seconds, tuple(crossing))


@dataclass(frozen=True)
class Cost:
    """A collective on idle links: its seconds, and its rounds that cross nodes, in order,
    as (rounds, messages between nodes in each): what loss and jitter act on (links.py)."""

    seconds: float
    crossing: tuple[tuple[int, int], ...] = ()


def _ranks(ranks: int | Sequence[int]) -> Sequence[int]:
    return range(ranks) if isinstance(ranks, int) else ranks


def _rank(key: object) -> int:
    try:
        rank = int(str(key))
    except ValueError:
        raise ConfigError(f"network.bandwidths: {key!r} is not a worker rank") from None
    if rank < 0:
        raise ConfigError(f"network.bandwidths: worker {rank} does not exist")
    return rank
