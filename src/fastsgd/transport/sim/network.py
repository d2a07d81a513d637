"""The simulated network: full-duplex NICs, nodes, per-worker bandwidths, loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastsgd.errors import ConfigError
from fastsgd.units import parse_bandwidth, parse_seconds

__all__ = ["Network", "parse_bandwidth", "parse_seconds"]
TCP_IP_HEADERS = 52  # bytes of each frame that are not payload: IPv4 20, TCP 20 + 12 options
FRAME_OVERHEAD = TCP_IP_HEADERS + 14  # and the Ethernet header

@dataclass(frozen=True)
class Network:
    """The simulated cluster's links (docs/simulator.md has every formula).

    Each worker has a full-duplex NIC of `bandwidth` bytes/s each way (`bandwidths`
    overrides it per rank): what it sends leaves one message after another at its uplink
    rate; what it receives comes in one after another at its downlink rate. Workers are
    grouped `workers_per_node` to a node; between workers of one node messages take
    `intra_latency` and `intra_bandwidth` instead. A point-to-point message is lost with
    probability `loss`: a reliable one (TCP) is sent again after `rto`, a droppable one
    (an asynchronous strategy's, see docs/strategies.md) is gone. `jitter` delays each
    message by up to that much more (uniform).
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

    def _ring(self, size: float, n: int, bandwidth: float, latency: float) -> float:
        return 0.0 if n <= 1 else 2 * (n - 1) * (latency + self.wire(size / n) / bandwidth)

    def allreduce_time(self, size: int, world_size: int) -> float:
        """Ring all-reduce 2(n-1)/n*S/B + 2(n-1)*L at the slowest NIC's B; over nodes of g
        workers (m nodes), hierarchical: a pipelined reduce inside each node (S/B_i +
        (g-1)*L_i), a ring across the nodes (2(m-1)/m*S/B + 2(m-1)*L), a pipelined broadcast
        inside each node (S/B_i + (g-1)*L_i)."""
        g = self.workers_per_node
        slowest = min(self.nic(r) for r in range(world_size))
        if g == 1:
            return self._ring(size, world_size, slowest, self.latency)
        inside = size / self.intra_bandwidth + (g - 1) * self.intra_latency
        return 2 * inside + self._ring(size, world_size // g, slowest, self.latency)

    def allgather_time(self, size: int, world_size: int) -> float:
        """Ring all-gather of one `size`-byte tensor per worker: (n-1)*(L + S/B), at the
        slowest NIC and, when there are several nodes, the inter-node latency."""
        if world_size <= 1:
            return 0.0
        slowest = min(self.nic(r) for r in range(world_size))
        latency = self.latency if world_size > self.workers_per_node else self.intra_latency
        bandwidth = slowest if world_size > self.workers_per_node else self.intra_bandwidth
        wire = self.wire(size) if world_size > self.workers_per_node else size
        return (world_size - 1) * (latency + wire / bandwidth)

    def broadcast_time(self, size: int, world_size: int) -> float:
        """A binomial tree: ceil(log2 n) rounds of one message (L + S/B)."""
        if world_size <= 1:
            return 0.0
        slowest = min(self.nic(r) for r in range(world_size))
        return (world_size - 1).bit_length() * (self.latency + self.wire(size) / slowest)


def _rank(key: object) -> int:
    try:
        rank = int(str(key))
    except ValueError:
        raise ConfigError(f"network.bandwidths: {key!r} is not a worker rank") from None
    if rank < 0:
        raise ConfigError(f"network.bandwidths: worker {rank} does not exist")
    return rank
