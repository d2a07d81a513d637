"""The state of the simulated links: when each NIC is next free, and the seeded draws of
jitter and loss. Times are integer nanoseconds (see network.py for the model)."""

from __future__ import annotations

import random

from fastsgd.transport.sim.compute import to_ns
from fastsgd.transport.sim.faults import Faults
from fastsgd.transport.sim.network import Network
from fastsgd.transport.sim.trace import Trace


class Links:
    def __init__(self, network: Network, world_size: int, trace: Trace | None = None,
                 outages: Faults | None = None):
        self.net, self.trace = network, trace
        self.outages = Faults() if outages is None else outages
        # per (rank, intra-node?): when its uplink / downlink finishes what it already carries
        self.up_free: dict[tuple[int, bool], int] = {}
        self.down_free: dict[tuple[int, bool], int] = {}
        self._jitter = random.Random(f"jitter/{network.seed}")
        self._loss = random.Random(f"loss/{network.seed}")
        self.lost = 0  # messages dropped for good
        self.resent = 0  # messages sent again after a timeout

    def nic(self, rank: int, now: int) -> float:
        traced = self.trace.bandwidth(rank, now) if self.trace else None
        return traced or self.net.nic(rank)

    def depart(self, src: int, dst: int, size: int, now: int) -> tuple[int, int]:
        """A `size`-byte message from `src` to `dst`, sent at `now`, leaves after what src
        is already sending, at its uplink rate: (when its first byte leaves, its last)."""
        intra = self.net.same_node(src, dst)
        up = self.net.intra_bandwidth if intra else self.nic(src, now)
        start = self.outages.back_up(src, max(now, self.up_free.get((src, intra), 0)))
        wire = size if intra else self.net.wire(size)
        sent = self.up_free[(src, intra)] = start + to_ns(wire / up)
        return start, sent

    def land(self, src: int, dst: int, size: int, start: int, sent: int,
             droppable: bool) -> int | None:
        """Called at `start`, in time order: the message comes in at dst's downlink rate
        after what dst is already receiving, and no sooner than it was sent. When it has
        arrived (ns), or None if it is lost."""
        net, intra = self.net, self.net.same_node(src, dst)
        down = net.intra_bandwidth if intra else self.nic(dst, start)
        wire = size if intra else net.wire(size)
        begins = self.outages.back_up(dst, max(start, self.down_free.get((dst, intra), 0)))
        received = max(sent, begins + to_ns(wire / down))
        self.down_free[(dst, intra)] = received
        if intra:  # loss and jitter are the network's between nodes, not a node's own links
            return received + to_ns(net.intra_latency)
        arrival = received + to_ns(net.latency)
        if net.jitter:
            arrival += to_ns(self._jitter.uniform(0, net.jitter))
        while net.loss and self._loss.random() < net.loss:
            if droppable:
                self.lost += 1
                return None
            self.resent += 1
            arrival += to_ns(net.rto)  # TCP sends it again after a retransmission timeout
        return arrival

    def delays(self, crossing: tuple[tuple[int, int], ...]) -> int:
        """What loss and jitter add to a collective whose rounds between nodes are
        `crossing` ((rounds, messages between nodes in each), network.Cost): a round waits
        for its slowest message, so for the largest of its k jitters (one draw u: u^(1/k)
        is distributed as the largest of k uniforms), and once for a retransmission timeout
        if any of its k messages is lost."""
        net, delay = self.net, 0
        if not (net.jitter or net.loss):
            return 0
        for rounds, k in crossing:
            if net.jitter:
                delay += sum(to_ns(net.jitter * self._jitter.random() ** (1 / k))
                             for _ in range(rounds))
            if net.loss:
                p_round = 1 - (1 - net.loss) ** k
                losses = sum(self._loss.random() < p_round for _ in range(rounds))
                self.resent += losses
                delay += losses * to_ns(net.rto)
        return delay
