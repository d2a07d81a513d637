"""SimTransport: the Transport of one logical worker in a simulated cluster.

Collectives complete when the last worker has arrived, after the time their algorithm takes
on the simulated network (network.py); collectives run one after another (they share the
links). Point-to-point messages cross the sender's uplink and the receiver's downlink
(links.py). Compute is charged by the compute model (compute.py). Bytes are counted as on
real processes. Times are integer nanoseconds; `now()` gives seconds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from fastsgd.transport.base import (
    Done,
    Handle,
    PeerLost,
    hierarchical_allreduce_bytes,
    nbytes,
    ring_allgather_bytes,
    ring_allreduce_bytes,
    tree_broadcast_bytes,
)
from fastsgd.transport.frames import frame_bytes
from fastsgd.transport.sim.clock import SimClock
from fastsgd.transport.sim.fabric import SimFabric
from fastsgd.transport.sim.handles import LeftUplink, SimHandle, sole_user
from fastsgd.transport.sim.lanes import Asked, Deferred, LaneUser
from fastsgd.transport.sim.members import SimMembers


class SimTransport(SimClock, SimMembers):
    """Transport of logical worker `rank` in a simulated cluster (see module docstring)."""

    def __init__(self, rank: int, fabric: SimFabric,
                 joining: tuple[int, int, int] | None = None):
        """`joining`: a new process in a lost one's place (run.rejoin: rejoins.py): the step
        it joins at, its donor's rank and the step the donor's process joined at."""
        self.rank = rank
        self.joining = joining
        self._step = joining[0] if joining else 0  # the step this worker is at
        self.world_size = fabric.world_size
        self.device = torch.device("cpu")
        self.fabric = fabric
        self.scheduler = fabric.scheduler
        self.network = fabric.network
        self.bytes_sent = 0
        self.bytes_received = 0
        self._seq = 0
        self.lane = LaneUser(fabric.lanes)
        self._asked: list[Asked] = []  # all-reduces asked in forward + backward, not started
        self._backward_next = False  # the offload in progress charged a forward

    def _collective(self, tensor: torch.Tensor, kind: str, size: int, combine: str | int,
                    out: torch.Tensor | None, average: bool = False) -> SimHandle:
        # no scheduling point: what a worker brings does not depend on what else is due
        give = combine == "sum" and out is tensor and sole_user(tensor)
        op = self.fabric.arrive(self._seq, self.rank, tensor,
                                lambda: self.fabric.price(kind, size), combine, give)
        self._seq += 1
        if give:
            tensor.set_()  # its memory is the collective's now (a part held) or free again
        return SimHandle(self, op, out, give, average)

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False,
                   average: bool = False) -> Handle:
        asked = self.lane.asked
        if asked is not None:  # during offloaded compute: started by compute("backward")
            if async_op:
                deferred = Deferred()
                asked.append((tensor, average, deferred))
                return deferred
            if self.lane.lanes is not None:
                raise RuntimeError("a blocking all-reduce during a simulated worker's "
                                   "backward: only asynchronous ones can be recorded")
            self._asked += asked  # without lanes: those asked before it start first, now
            asked.clear()
            self._start_asked()
        return self._all_reduce(tensor, async_op, average)

    def _all_reduce(self, tensor: torch.Tensor, async_op: bool, average: bool) -> SimHandle:
        size = nbytes(tensor)
        self._count(*self._allreduce_traffic(size))
        handle = self._collective(tensor, "allreduce", size, "sum", tensor, average)
        if not async_op:
            handle.wait()
        return handle

    def _allreduce_traffic(self, size: int) -> tuple[int, int]:
        """What this worker sends and receives in an all-reduce among those taking part: a
        flat ring's share, or its part of the hierarchy where nodes hold several."""
        per_node = self.fabric.network.workers_per_node
        if per_node == 1:
            n = self._taking_part()
            return ring_allreduce_bytes(size, n), ring_allreduce_bytes(size, n)
        known = self.fabric.membership.known
        ranks = [r for r in range(self.world_size) if r not in known or r == self.rank]
        return hierarchical_allreduce_bytes(size, self.rank, ranks, per_node)

    def _taking_part(self) -> int:
        """Workers a collective is counted for when asked: all but those known lost (its
        price counts those known lost when it starts, fabric.price)."""
        return self.world_size - len(self.fabric.membership.known)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        size, n = nbytes(tensor), self._taking_part()
        self._count(ring_allgather_bytes(size, n), ring_allgather_bytes(size, n))
        handle = self._collective(tensor, "allgather", size, "gather", None)
        handle.wait()
        return list(handle._op.result.unbind(0))

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        size, n = nbytes(tensor), self._taking_part()
        self._count(tree_broadcast_bytes(size, n, self.rank, src), 0 if self.rank == src else size)
        self._collective(tensor, "broadcast", size, src, tensor).wait()

    def barrier(self) -> None:
        self._collective(torch.zeros(0), "allreduce", 0, "sum", None).wait()

    def send(self, tensor: torch.Tensor, dst: int, copy: bool = True) -> Handle:
        self.scheduler.yield_(self.rank)
        self._count(nbytes(tensor), 0)
        self.fabric.post(self.rank, dst, tensor, copy=copy, to=self._to(dst))
        return Done()

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(self._take_sent(src))

    def _take_sent(self, src: int) -> torch.Tensor:
        """The next tensor `src` sent to this worker (PeerLost if it left without it)."""
        queue = self.fabric.inbox[(src, self.rank)]  # empty: block, which runs what is due
        fabric = self.fabric  # lost, or the process standing for src at this step left
        gone = src in fabric.membership.known or (fabric.membership.departures
                                                  and src in self.absent(self._step))
        coming = not gone or fabric.in_transit[(src, self.rank)]
        if not queue and coming:
            self.fabric.receiving[self.rank] = src
            self.scheduler.block(self.rank)
            self.fabric.news.pop(self.rank, None)
        if not queue:
            raise PeerLost([src])
        tensor = queue.popleft()
        self._received(nbytes(tensor))
        return tensor

    def exchange(self, outgoing: list[tuple[int, torch.Tensor]], sources: list[int],
                 like: torch.Tensor) -> dict[int, torch.Tensor]:
        """Simulated links are full duplex: posting the sends first loses nothing. Real
        processes send to all their peers at once (TCP flows share the uplink); the
        simulated uplink sends one message after another, so each worker starts with the
        peer after itself ((dst - rank) mod n): everyone's first message then goes to a
        different receiver, as shared flows would spread them (in rank order, a 3-worker
        ring sent both first messages to rank 0 and took 3 S/B instead of 2). The tensors
        travel as they are, with no copy, and what came is the senders' tensors themselves,
        which neither side changes (base.py): no copy, and no buffer held while waiting,
        per simulated worker (1024 of them)."""
        n = self.world_size
        for dst, tensor in sorted(outgoing, key=lambda m: (m[0] - self.rank) % n):
            self.send(tensor, dst, copy=False)
        received, lost = {}, []
        for src in sources:
            try:
                received[src] = self._take_sent(src).view_as(like)
            except PeerLost:
                lost.append(src)
        if lost:
            raise PeerLost(lost, received)
        return received

    def shared_tensor(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """One tensor for all the simulated workers (they share one process): the lowest
        rank's `like`, whichever worker the scheduler runs first (so a run repeats)."""
        self.barrier()
        offered = self.fabric.shared.setdefault(f"{name}/offered", {})
        offered[self.rank] = like
        self.barrier()  # every worker has offered its own
        if name not in self.fabric.shared:
            self.fabric.shared[name] = offered[min(offered)].detach().reshape(-1).clone()
        return self.fabric.shared[name]

    def start_messages(self) -> None:
        """Nothing to start: the simulated network delivers mail by itself."""

    def post(self, tensor: torch.Tensor, dst: int, tag: int, droppable: bool = False) -> Handle:
        handling = self.fabric.handling_at is not None  # handlers run between scheduling points
        if not handling:
            self.scheduler.yield_(self.rank)
        if dst != self.rank:
            self._count(frame_bytes(tensor), 0)
        left = self.fabric.post(self.rank, dst, tensor, tag, droppable, copy=False,
                                to=self._to(dst))
        return Done() if handling or left is None else LeftUplink(self, left)

    def _to(self, dst: int) -> int:
        """The process standing for `dst` that a message is meant for, by its join step: at
        this worker's step, or for a handler's reply, the one that sent the request."""
        fabric = self.fabric
        if fabric.handling_at is not None and fabric.replying[0] == dst:
            return fabric.replying[1]
        return fabric.membership.roster.returned_at(dst, self._step)

    def serve(self, tag: int, handler: Callable[[int, torch.Tensor], None]) -> None:
        """Run `handler(src, payload)` when a message with `tag` arrives, at its arrival
        time; it may `post` replies, which leave at that time."""
        self.fabric.handlers[(self.rank, tag)] = handler

    def poll(self, tag: int) -> list[tuple[int, torch.Tensor]]:
        self.scheduler.yield_(self.rank)
        queue = self.fabric.mail[(self.rank, tag)]
        out = list(queue)
        queue.clear()
        self._received(sum(frame_bytes(t) for _, t in out))
        return out

    def wait_message(self, tag: int) -> tuple[int, torch.Tensor]:
        queue = self.fabric.mail[(self.rank, tag)]  # empty: block, which runs what is due
        if not queue:
            self.fabric.awaiting[self.rank] = tag
            self.scheduler.block(self.rank)
            lost = self.fabric.news.pop(self.rank, None)
            if not queue:  # woken by a departure: the caller counts again
                assert lost is not None
                raise PeerLost([lost])
        src, payload = queue.popleft()
        self._received(frame_bytes(payload))
        return src, payload

    def take_from(self, tag: int, src: int, step: int | None = None,
                  timeout: float | None = None) -> torch.Tensor:
        """The next message with `tag` from `src`, waiting for one on its way. Else
        PeerLost when the process that would send it (standing for `src` at `step`, or at
        this worker's) is known lost, even if another has taken its rank's place since.
        Virtual time does not time out."""
        queue = self.fabric.mail[(self.rank, tag)]
        standing = self.returned_at(src, self._step if step is None else step)
        while True:
            for i, (sender, payload) in enumerate(queue):
                if sender == src:
                    del queue[i]
                    self._received(frame_bytes(payload))
                    return payload
            gone = src in self.departed() or self.returned_at(src, sys.maxsize) != standing
            if gone and not self.fabric.coming[(src, self.rank, tag)]:
                raise PeerLost([src])
            self.fabric.awaiting[self.rank] = tag
            self.scheduler.block(self.rank)  # woken by a message or a departure
            self.fabric.news.pop(self.rank, None)

    def _received(self, size: int) -> None:
        """Count what came in; adding it into one's own vector is compute (reduce_bandwidth)."""
        self._count(0, size)
        self.scheduler.charge(self.rank, self.fabric.compute.reduce_ns(size))

    def _count(self, sent: int, received: int) -> None:
        self.bytes_sent += sent
        self.bytes_received += received
