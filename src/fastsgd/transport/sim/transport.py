"""SimTransport: the Transport of one logical worker in a simulated cluster.

Collectives complete when the last worker has arrived, after the time their algorithm takes
on the simulated network (network.py); collectives run one after another (they share the
links). Point-to-point messages cross the sender's uplink and the receiver's downlink
(links.py). Compute is charged by the compute model (compute.py). Bytes are counted as on
real processes. Times are integer nanoseconds; `now()` gives seconds.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable

import torch

from fastsgd.transport.base import (
    Done,
    Handle,
    PeerLost,
    nbytes,
    ring_allgather_bytes,
    ring_allreduce_bytes,
    tree_broadcast_bytes,
)
from fastsgd.transport.frames import frame_bytes
from fastsgd.transport.sim.collective import Collective, finish_sum, fold
from fastsgd.transport.sim.compute import ComputeModel, to_ns
from fastsgd.transport.sim.faults import Crashed, Faults, Membership
from fastsgd.transport.sim.links import Links
from fastsgd.transport.sim.network import Network
from fastsgd.transport.sim.scheduler import Scheduler


class SimFabric:
    """What the workers of one simulated cluster share: the scheduler, the network, queues."""

    def __init__(self, world_size: int, network: Network, scheduler: Scheduler,
                 compute: ComputeModel, faults: Faults | None = None):
        self.world_size = world_size
        self.network, self.compute = network, compute
        self.scheduler = scheduler
        self.links = Links(network, world_size, compute.trace, faults)
        self.collectives: dict[int, Collective] = {}
        self.collectives_free = 0  # when the links are free for the next collective
        self.server_free = [0] * world_size  # when each worker's message handler is free
        self.inbox: dict[tuple[int, int], deque[torch.Tensor]] = defaultdict(deque)
        self.receiving: dict[int, int] = {}  # rank -> src it blocks on
        self.in_transit: dict[tuple[int, int], int] = defaultdict(int)  # (src, dst) -> sends
        self.mail: dict[tuple[int, int], deque[tuple[int, torch.Tensor]]] = defaultdict(deque)
        self.awaiting: dict[int, int] = {}  # rank -> message tag it blocks on
        self.handlers: dict[tuple[int, int], Callable[[int, torch.Tensor], None]] = {}
        self.handling_at: int | None = None  # set while a handler runs (scheduler thread)
        self.shared: dict[str, torch.Tensor] = {}
        self.membership = Membership(Faults() if faults is None else faults, world_size)
        self.news: dict[int, int] = {}  # rank -> the departure that woke it
        self.on_death: list[Callable[[], None]] = []  # e.g. the observer counting again

    def arrive(self, seq: int, rank: int, tensor: torch.Tensor, duration: Callable[[], int],
               combine: str | int) -> Collective:
        """Worker `rank` joins collective `seq`; the first to arrive prices it."""
        op = self.collectives.get(seq)
        if op is None:
            op = self.collectives[seq] = Collective(duration(), combine)
        fold(op, rank, tensor.detach())
        op.ranks.add(rank)
        op.arrival = max(op.arrival, self.scheduler.now(rank))
        self._start_if_all_in(seq, op)
        return op

    def _start_if_all_in(self, seq: int, op: Collective, not_before: int = 0) -> None:
        """Once every worker not known to be lost has arrived, the collective runs (among
        the survivors: a worker lost before it came is waited for until the loss is known,
        at `not_before`)."""
        known = self.membership.known
        if op.started or len(op.ranks - known.keys()) < self.world_size - len(known):
            return
        if op.ranks & known.keys():
            raise RuntimeError(f"collective {seq}: worker(s) {sorted(op.ranks & known.keys())} "
                               "took part and were lost before it completed")
        op.started = True
        if op.combine == "gather":  # the survivors' tensors, in rank order
            op.result = torch.stack([op.parts.pop(r) for r in sorted(op.parts)])
        elif op.combine == "sum":  # parts held back behind a lost rank's turn, in rank order
            finish_sum(op)
        elif op.result is None:
            raise RuntimeError(f"collective {seq}: a broadcast from worker {op.combine}, "
                               "which was lost")
        start = max(op.arrival, self.collectives_free, not_before)
        members = self.membership.members
        finish = self.membership.faults.clear_window(members, start, op.duration) + op.duration
        self.collectives_free = finish
        self.scheduler.at(finish, lambda: self._complete(seq, op, finish))

    def crash(self, rank: int, step: int) -> None:
        """Worker `rank` crashes now (faults.py); the survivors learn it `detect` later."""
        now = self.scheduler.now(rank)
        self.membership.die(rank, step, now)
        for action in self.on_death:
            action()
        when = now + self.membership.faults.detect_ns
        self.scheduler.at(when, lambda: self._learn(rank, when))

    def _learn(self, lost: int, when: int) -> None:
        """Every survivor now knows: those blocked on `lost`, or waiting for any message,
        wake (PeerLost); collectives waiting for it go on without it."""
        self.membership.learn(lost)
        blocked = [r for r, src in self.receiving.items()
                   if src == lost and not self.in_transit[(lost, r)]] + list(self.awaiting)
        for rank in sorted(blocked):
            self.receiving.pop(rank, None)
            self.awaiting.pop(rank, None)
            self.news[rank] = lost
            self.scheduler.wake(rank, when)
        for seq, op in sorted(self.collectives.items()):
            self._start_if_all_in(seq, op, when)

    def state(self) -> dict:
        """What a resumed simulation needs of the cluster at a quiet point (a checkpoint's
        barrier): when links and handlers are next free, the jitter and loss draws."""
        links = self.links
        return {"collectives_free": self.collectives_free, "server_free": list(self.server_free),
                "up_free": dict(links.up_free), "down_free": dict(links.down_free),
                "jitter": links._jitter.getstate(), "loss": links._loss.getstate(),
                "lost": links.lost, "resent": links.resent}

    def load_state(self, saved: dict) -> None:
        links = self.links
        self.collectives_free, self.server_free = saved["collectives_free"], saved["server_free"]
        links.up_free, links.down_free = dict(saved["up_free"]), dict(saved["down_free"])
        links._jitter.setstate(saved["jitter"])
        links._loss.setstate(saved["loss"])
        links.lost, links.resent = saved["lost"], saved["resent"]

    def in_flight(self) -> int:
        """Messages sent but not yet taken by their receiver."""
        return (len(self.scheduler._events) + sum(map(len, self.inbox.values()))
                + sum(map(len, self.mail.values())))

    def price(self, kind: str, size: int) -> int:
        """Nanoseconds a collective takes: its algorithm on the network (network.py), plus a
        retransmission timeout for each round of messages that loses one (TCP)."""
        n, net = self.world_size - len(self.membership.known), self.network
        seconds, rounds = {"allreduce": (net.allreduce_time, 2 * (n - 1)),
                           "allgather": (net.allgather_time, n - 1),
                           "broadcast": (net.broadcast_time, (n - 1).bit_length())}[kind]
        return to_ns(seconds(size, n)) + self.links.collective_losses(rounds, n)

    def _complete(self, seq: int, op: Collective, finish: int) -> None:
        op.end = finish
        del self.collectives[seq]
        for rank in op.waiting:
            self.scheduler.wake(rank, op.end)

    def post(self, src: int, dst: int, tensor: torch.Tensor, tag: int | None = None,
             droppable: bool = False, copy: bool = True) -> None:
        """Put `tensor` on src's link to dst: to the matching `recv` (tag None) or to dst's
        mailbox or handler for `tag`. A message to oneself arrives at once. `copy` False:
        the tensor itself travels (the sender will not change it, nor will the receivers)."""
        size = nbytes(tensor) if tag is None else frame_bytes(tensor)
        now = self.scheduler.now(src) if self.handling_at is None else self.handling_at
        payload = tensor.detach() if tag is None else tensor.detach().reshape(-1)
        payload = payload.clone() if copy else payload
        if tag is None:
            self.in_transit[(src, dst)] += 1
        if src == dst:
            self.scheduler.at(now, lambda: self._file(src, dst, tag, payload, now))
            return
        start, sent = self.links.depart(src, dst, size, now)

        def land() -> None:  # at `start`: downlinks take messages in the order they come
            arrival = self.links.land(src, dst, size, start, sent, droppable)
            if arrival is not None:
                self.scheduler.at(arrival, lambda: self._file(src, dst, tag, payload, arrival))

        self.scheduler.at(start, land)

    def _file(self, src: int, dst: int, tag: int | None, payload: torch.Tensor,
              arrival: int) -> None:
        """A message arrives: to its handler, or queued, waking dst if it waits for it.
        A message to a worker that has crashed is lost."""
        if tag is None:
            self.in_transit[(src, dst)] -= 1
        if not self.membership.alive(dst):
            return
        handler = self.handlers.get((dst, tag)) if tag is not None else None
        if handler is not None:
            # the handler works on dst's behalf, one message after another; its replies
            # leave when it is done
            start = max(arrival, self.server_free[dst])
            self.handling_at = self.server_free[dst] = start + self.compute.reduce_ns(
                frame_bytes(payload))
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
    def __init__(self, transport: SimTransport, op: Collective, out: torch.Tensor | None):
        self._transport, self._op, self._out = transport, op, out

    def wait(self) -> None:
        t = self._transport  # no yield first: blocking runs what is due, then wakes us
        if self._op.end is None:
            self._op.waiting.add(t.rank)
            t.scheduler.block(t.rank)
        if self._out is not None:
            self._out.copy_(self._op.result)
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

    def _collective(self, tensor: torch.Tensor, kind: str, size: int, combine: str | int,
                    out: torch.Tensor | None) -> SimHandle:
        # no scheduling point: what a worker brings does not depend on what else is due
        op = self.fabric.arrive(self._seq, self.rank, tensor,
                                lambda: self.fabric.price(kind, size), combine)
        self._seq += 1
        return SimHandle(self, op, out)

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> Handle:
        size, n = nbytes(tensor), self.world_size
        self._count(ring_allreduce_bytes(size, n), ring_allreduce_bytes(size, n))
        handle = self._collective(tensor, "allreduce", size, "sum", tensor)
        if not async_op:
            handle.wait()
        return handle

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        size, n = nbytes(tensor), self.world_size
        self._count(ring_allgather_bytes(size, n), ring_allgather_bytes(size, n))
        handle = self._collective(tensor, "allgather", size, "gather", None)
        handle.wait()
        return list(handle._op.result.unbind(0))

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        size, n = nbytes(tensor), self.world_size
        self._count(tree_broadcast_bytes(size, n, self.rank, src), 0 if self.rank == src else size)
        self._collective(tensor, "broadcast", size, src, tensor).wait()

    def barrier(self) -> None:
        self._collective(torch.zeros(0), "allreduce", 0, "sum", None).wait()

    def send(self, tensor: torch.Tensor, dst: int, copy: bool = True) -> Handle:
        self.scheduler.yield_(self.rank)
        self._count(nbytes(tensor), 0)
        self.fabric.post(self.rank, dst, tensor, copy=copy)
        return Done()

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(self._take_sent(src))

    def _take_sent(self, src: int) -> torch.Tensor:
        """The next tensor `src` sent to this worker (PeerLost if it left without it)."""
        queue = self.fabric.inbox[(src, self.rank)]  # empty: block, which runs what is due
        fabric = self.fabric
        coming = src not in fabric.membership.known or fabric.in_transit[(src, self.rank)]
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
        """One tensor for all the simulated workers (they share one process)."""
        self.barrier()
        shared = self.fabric.shared.setdefault(name, like.detach().reshape(-1).clone())
        self.barrier()
        return shared

    def start_messages(self) -> None:
        """Nothing to start: the simulated network delivers mail by itself."""

    def post(self, tensor: torch.Tensor, dst: int, tag: int, droppable: bool = False) -> None:
        if self.fabric.handling_at is None:  # handlers run between scheduling points
            self.scheduler.yield_(self.rank)
        if dst != self.rank:
            self._count(frame_bytes(tensor), 0)
        self.fabric.post(self.rank, dst, tensor, tag, droppable, copy=False)

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

    def members(self) -> list[int]:
        fabric = self.fabric  # (a handler sees what happened before its own time)
        if fabric.membership.faults.crashing and fabric.handling_at is None:
            self.scheduler.yield_(self.rank)  # what happened before this worker's clock
        return list(fabric.membership.members)

    def departed(self) -> dict[int, tuple[int, float]]:
        membership = self.fabric.membership
        return {r: (membership.dead[r], membership.when[r]) for r in membership.known}

    def now(self) -> float:
        return self.scheduler.now(self.rank) / 1e9

    def now_ns(self) -> int:
        return self.scheduler.now(self.rank)

    def set_clock(self, ns: int) -> None:
        """Resume: this worker's clock where the checkpoint left it."""
        self.scheduler.workers[self.rank].clock = ns

    def compute(self, phase: str, step: int) -> None:
        """Charge the compute model's time for `phase` of `step` (see compute.py)."""
        model, rank = self.fabric.compute, self.rank
        now = self.scheduler.now(rank)
        if phase == "update" and self.fabric.membership.crash_due(rank, now, step):
            self.fabric.crash(rank, step)  # after its optimizer step, before it exchanges
            raise Crashed()
        if not model.deterministic:
            self.scheduler.set_wall_factor(rank, model.factor(rank, step, now))
            return
        start = model.available_ns(rank, now)
        self.scheduler.charge(rank, start - now + model.phase_ns(phase, rank, step, start))
        if phase == "update":  # once a step: workers that never talk (hogwild) interleave
            self.scheduler.yield_(rank)

    def off_clock(self) -> None:
        """Do not charge the time since the last transport call (evaluation, logging)."""
        self.scheduler.off_clock(self.rank)

    def _received(self, size: int) -> None:
        """Count what came in; adding it into one's own vector is compute (reduce_bandwidth)."""
        self._count(0, size)
        self.scheduler.charge(self.rank, self.fabric.compute.reduce_ns(size))

    def _count(self, sent: int, received: int) -> None:
        self.bytes_sent += sent
        self.bytes_received += received
