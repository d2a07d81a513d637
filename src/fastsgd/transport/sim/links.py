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
        arrival = received + to_ns(net.intra_latency if intra else net.latency)
        if net.jitter:
            arrival += to_ns(self._jitter.uniform(0, net.jitter))
        while net.loss and self._loss.random() < net.loss:
            if droppable:
                self.lost += 1
                return None
            self.resent += 1
            arrival += to_ns(net.rto)  # TCP sends it again after a retransmission timeout
        return arrival

    def collective_losses(self, messages_in_sequence: int, parallel: int) -> int:
        """Retransmission timeouts a collective of `messages_in_sequence` rounds of
        `parallel` messages waits for: a round waits once if any of its messages is lost."""
        if not self.net.loss:
            return 0
        p_round = 1 - (1 - self.net.loss) ** parallel
        losses = sum(self._loss.random() < p_round for _ in range(messages_in_sequence))
        self.resent += losses
        return losses * to_ns(self.net.rto)
