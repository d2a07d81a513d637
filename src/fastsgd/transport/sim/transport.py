"""SimTransport: the Transport of one logical worker in a simulated cluster.

Collectives complete when the last worker has arrived, after the time the ring algorithm
takes on the simulated network; collectives run one after another (they share the links).
Point-to-point messages leave a worker's link one at a time and arrive
`latency + bytes / bandwidth` later. Bytes are counted as on real processes.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fastsgd.transport.base import (
    Done,
    Handle,
    nbytes,
    ring_allgather_bytes,
    ring_allreduce_bytes,
    tree_broadcast_bytes,
)
from fastsgd.transport.frames import frame_bytes
from fastsgd.transport.sim.network import Network
from fastsgd.transport.sim.scheduler import Scheduler

Combine = Callable[[list[torch.Tensor]], list[torch.Tensor]]


@dataclass
class _Collective:
    """One collective call, matched across workers by its sequence number."""

    duration: float
    combine: Combine
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    arrival: float = 0.0
    end: float | None = None
    waiting: set[int] = field(default_factory=set)


class SimFabric:
    """What the workers of one simulated cluster share: the scheduler, the network, queues."""

    def __init__(self, world_size: int, network: Network, scheduler: Scheduler):
        self.world_size = world_size
        self.network = network
        self.scheduler = scheduler
        self.collectives: dict[int, _Collective] = {}
        self.collectives_free = 0.0  # when the links are free for the next collective
        self.link_free = [0.0] * world_size  # when each worker's outgoing link is free
        self.inbox: dict[tuple[int, int], deque[torch.Tensor]] = defaultdict(deque)
        self.receiving: dict[int, int] = {}  # rank -> src it blocks on
        self.mail: dict[tuple[int, int], deque[tuple[int, torch.Tensor]]] = defaultdict(deque)
        self.awaiting: dict[int, int] = {}  # rank -> message tag it blocks on
        self.jitter = random.Random(network.seed)
        self.handlers: dict[tuple[int, int], Callable[[int, torch.Tensor], None]] = {}
        self.handling_at: float | None = None  # set while a handler runs (scheduler thread)
        self.shared: dict[str, torch.Tensor] = {}

    def arrive(self, seq: int, rank: int, tensor: torch.Tensor, duration: float,
               combine: Combine) -> _Collective:
        op = self.collectives.setdefault(seq, _Collective(duration, combine))
        op.inputs[rank] = tensor.detach().clone()
        op.arrival = max(op.arrival, self.scheduler.now(rank))
        if len(op.inputs) == self.world_size:
            results = op.combine([op.inputs[r] for r in range(self.world_size)])
            op.outputs = dict(enumerate(results))
            finish = max(op.arrival, self.collectives_free) + op.duration
            self.collectives_free = finish
            self.scheduler.at(finish, lambda: self._complete(seq, op, finish))
        return op

    def _complete(self, seq: int, op: _Collective, finish: float) -> None:
        op.end = finish
        del self.collectives[seq]
        for rank in op.waiting:
            self.scheduler.wake(rank, op.end)

    def post(self, src: int, dst: int, tensor: torch.Tensor, tag: int | None = None) -> None:
        """Put `tensor` on src's link to dst: to the matching `recv` (tag None) or to dst's
        mailbox or handler for `tag`. A message to oneself arrives at once."""
        size = nbytes(tensor) if tag is None else frame_bytes(tensor)
        now = self.scheduler.now(src) if self.handling_at is None else self.handling_at
        payload = tensor.detach().clone() if tag is None else tensor.detach().reshape(-1).clone()
        arrival = now
        if src != dst:
            start = max(now, self.link_free[src])
            self.link_free[src] = start + self.network.transfer_time(size)
            arrival = start + self.network.message_time(size)
            if self.network.jitter:
                arrival += self.jitter.uniform(0, self.network.jitter)

        self.scheduler.at(arrival, lambda: self._file(src, dst, tag, payload, arrival))

    def _file(self, src: int, dst: int, tag: int | None, payload: torch.Tensor,
              arrival: float) -> None:
        """A message arrives: to its handler, or queued, waking dst if it waits for it."""
        handler = self.handlers.get((dst, tag)) if tag is not None else None
        if handler is not None:
            self.handling_at = arrival
            try:
                handler(src, payload)
            finally:
                self.handling_at = None
            return
        if tag is None:
            self.inbox[(src, dst)].append(payload)
            blocked, key = self.receiving, src
        else:
            self.mail[(dst, tag)].append((src, payload))
            blocked, key = self.awaiting, tag
        if blocked.get(dst) == key:
            del blocked[dst]
            self.scheduler.wake(dst, arrival)


class SimHandle:
    def __init__(self, transport: SimTransport, op: _Collective, out: torch.Tensor | None):
        self._transport, self._op, self._out = transport, op, out

    def wait(self) -> None:
        t = self._transport
        t.scheduler.yield_(t.rank)
        if self._op.end is None:
            self._op.waiting.add(t.rank)
            t.scheduler.block(t.rank)
        if self._out is not None:
            self._out.copy_(self._op.outputs[t.rank])
            self._out = None


class SimTransport:
    """Transport of logical worker `rank` in a simulated cluster (see module docstring)."""

    def __init__(self, rank: int, fabric: SimFabric):
        self.rank = rank
        self.world_size = fabric.world_size
        self.device = torch.device("cpu")
        self.fabric = fabric
        self.scheduler = fabric.scheduler
        self.network = fabric.network
        self.bytes_sent = 0
        self.bytes_received = 0
        self._seq = 0

    def _collective(self, tensor: torch.Tensor, duration: float, combine: Combine,
                    out: torch.Tensor | None) -> SimHandle:
        self.scheduler.yield_(self.rank)
        op = self.fabric.arrive(self._seq, self.rank, tensor, duration, combine)
        self._seq += 1
        return SimHandle(self, op, out)

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> Handle:
        size, n = nbytes(tensor), self.world_size
        self._count(ring_allreduce_bytes(size, n), ring_allreduce_bytes(size, n))
        handle = self._collective(tensor, self.network.allreduce_time(size, n), _sum, tensor)
        if not async_op:
            handle.wait()
        return handle

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        size, n = nbytes(tensor), self.world_size
        self._count(ring_allgather_bytes(size, n), ring_allgather_bytes(size, n))
        handle = self._collective(tensor, self.network.allgather_time(size, n), _stack, None)
        handle.wait()
        return list(handle._op.outputs[self.rank].unbind(0))

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        size, n = nbytes(tensor), self.world_size
        self._count(tree_broadcast_bytes(size, n, self.rank, src), 0 if self.rank == src else size)
        duration = self.network.allgather_time(size, 2) * max(1, (n - 1).bit_length())
        self._collective(tensor, duration, lambda ts: [ts[src]] * n, tensor).wait()

    def barrier(self) -> None:
        empty = torch.zeros(0)
        self._collective(empty, self.network.allreduce_time(0, self.world_size), _sum, None).wait()

    def send(self, tensor: torch.Tensor, dst: int) -> Handle:
        self.scheduler.yield_(self.rank)
        self._count(nbytes(tensor), 0)
        self.fabric.post(self.rank, dst, tensor)
        return Done()

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self.scheduler.yield_(self.rank)
        queue = self.fabric.inbox[(src, self.rank)]
        if not queue:
            self.fabric.receiving[self.rank] = src
            self.scheduler.block(self.rank)
        tensor.copy_(queue.popleft())
        self._count(0, nbytes(tensor))

    def exchange(self, outgoing: list[tuple[int, torch.Tensor]],
                 incoming: list[tuple[int, torch.Tensor]]) -> None:
        """Simulated links are full duplex: posting the sends first loses nothing."""
        for dst, tensor in outgoing:
            self.send(tensor, dst)
        for src, buffer in incoming:
            self.recv(buffer, src)

    def shared_tensor(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """One tensor for all the simulated workers (they share one process)."""
        self.barrier()
        shared = self.fabric.shared.setdefault(name, like.detach().reshape(-1).clone())
        self.barrier()
        return shared

    def start_messages(self) -> None:
        """Nothing to start: the simulated network delivers mail by itself."""

    def post(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        if self.fabric.handling_at is None:  # handlers run between scheduling points
            self.scheduler.yield_(self.rank)
        if dst != self.rank:
            self._count(frame_bytes(tensor), 0)
        self.fabric.post(self.rank, dst, tensor, tag)

    def serve(self, tag: int, handler: Callable[[int, torch.Tensor], None]) -> None:
        """Run `handler(src, payload)` when a message with `tag` arrives, at its arrival
        time; it may `post` replies, which leave at that time."""
        self.fabric.handlers[(self.rank, tag)] = handler

    def poll(self, tag: int) -> list[tuple[int, torch.Tensor]]:
        self.scheduler.yield_(self.rank)
        queue = self.fabric.mail[(self.rank, tag)]
        out = list(queue)
        queue.clear()
        self._count(0, sum(frame_bytes(t) for _, t in out))
        return out

    def wait_message(self, tag: int) -> tuple[int, torch.Tensor]:
        self.scheduler.yield_(self.rank)
        queue = self.fabric.mail[(self.rank, tag)]
        if not queue:
            self.fabric.awaiting[self.rank] = tag
            self.scheduler.block(self.rank)
        src, payload = queue.popleft()
        self._count(0, frame_bytes(payload))
        return src, payload

    def now(self) -> float:
        return self.scheduler.now(self.rank)

    def off_clock(self) -> None:
        """Do not charge the time since the last transport call (evaluation, logging)."""
        self.scheduler.off_clock(self.rank)

    def _count(self, sent: int, received: int) -> None:
        self.bytes_sent += sent
        self.bytes_received += received


def _sum(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    total = tensors[0].clone()
    for t in tensors[1:]:
        total += t
    return [total] * len(tensors)


def _stack(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    stacked = torch.stack(tensors)
    return [stacked] * len(tensors)
