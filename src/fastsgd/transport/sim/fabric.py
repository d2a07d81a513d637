"""SimFabric: what the logical workers of a simulated cluster share (transport.py gives each
its Transport on it): the collectives in progress, the mail in flight, and who is still in
the run."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import torch

from fastsgd.transport.base import nbytes
from fastsgd.transport.frames import frame_bytes
from fastsgd.transport.sim.collective import Collective, check_alike, finish_sum, fold
from fastsgd.transport.sim.compute import ComputeModel, to_ns
from fastsgd.transport.sim.faults import Faults, Membership
from fastsgd.transport.sim.lanes import Lanes
from fastsgd.transport.sim.links import Links
from fastsgd.transport.sim.network import Network
from fastsgd.transport.sim.scheduler import Scheduler


class SimFabric:
    """What the workers of one simulated cluster share: the scheduler, the network, queues."""

    def __init__(self, world_size: int, network: Network, scheduler: Scheduler,
                 compute: ComputeModel, faults: Faults | None = None,
                 lanes: Lanes | None = None):
        self.world_size = world_size
        self.lanes = lanes  # compute lanes (lanes.py), or None: all on the scheduler's thread
        self.network, self.compute = network, compute
        self.scheduler = scheduler
        self.links = Links(network, world_size, compute.trace, faults)
        self.collectives: dict[int, Collective] = {}
        self.collectives_free = 0  # when the links are free for the next collective
        self.server_free = [0] * world_size  # when each worker's message handler is free
        self.inbox: dict[tuple[int, int], deque[torch.Tensor]] = defaultdict(deque)
        self.receiving: dict[int, int] = {}  # rank -> src it blocks on
        self.in_transit: dict[tuple[int, int], int] = defaultdict(int)  # (src, dst) -> sends
        self.coming: dict[tuple[int, int, int], int] = defaultdict(int)  # (src, dst, tag) ->
        # messages on their way that cannot be lost (not droppable)
        self.mail: dict[tuple[int, int], deque[tuple[int, torch.Tensor]]] = defaultdict(deque)
        self.awaiting: dict[int, int] = {}  # rank -> message tag it blocks on
        self.handlers: dict[tuple[int, int], Callable[[int, torch.Tensor], None]] = {}
        self.handling_at: int | None = None  # set while a handler runs (scheduler thread)
        self.shared: dict[str, Any] = {}  # shared_tensor: the tensors, and what was offered
        self.membership = Membership(Faults() if faults is None else faults, world_size)
        self.news: dict[int, int] = {}  # rank -> the departure that woke it
        self.on_death: list[Callable[[], None]] = []  # e.g. the observer counting again
        # run.rejoin: replace(lost rank, when its loss is known) starts a new process
        self.replace: Callable[[int, int], None] | None = None
        self.progress = [0] * world_size  # the step each worker last started
        self.replying: tuple[int, int] = (-1, 0)  # while a handler runs: (src, its process)
        self.pricing: Collective | None = None  # the collective being priced (price)

    def arrive(self, seq: int, rank: int, tensor: torch.Tensor, duration: Callable[[], int],
               combine: str | int, given: bool = False) -> Collective:
        """Worker `rank` joins collective `seq`; `duration()` prices it once it starts.
        `given`: the worker gives `tensor` up (fold)."""
        op = self.collectives.get(seq)
        if op is None:
            op = self.collectives[seq] = Collective(combine, duration)
        check_alike(op, seq, rank, combine, tensor, self.progress[rank] + 1)
        fold(op, rank, tensor.detach(), given)
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
        op.start = start = max(op.arrival, self.collectives_free, not_before)
        # priced now, not at the first arrival: among those who take part (a loss learnt
        # meanwhile counts), at their NICs of this moment (a trace's)
        self.pricing = op
        try:
            op.duration = op.price()
        finally:
            self.pricing = None
        members = self.membership.members
        finish = self.membership.faults.clear_window(members, start, op.duration) + op.duration
        self.collectives_free = finish
        self.scheduler.at(finish, lambda: self._complete(seq, op, finish))

    def crash(self, rank: int, step: int) -> None:
        """Worker `rank` crashes now (faults.py); the survivors learn it `detect` later."""
        now = self.scheduler.now(rank)
        self.membership.die(rank, step, now)
        if self.replace is not None:  # what waited for this process is lost with it
            for queue in [q for (_, dst), q in self.inbox.items() if dst == rank]:
                queue.clear()
            for queue in [q for (dst, _), q in self.mail.items() if dst == rank]:
                queue.clear()
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
        if self.replace is not None:
            self.replace(lost, when)

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
        """Nanoseconds the collective starting now (`pricing`) takes: its algorithm among the
        ranks that take part, on their NICs and nodes (network.py), plus what loss and jitter
        add to its rounds between nodes (links.py)."""
        op = self.pricing
        ranks = sorted(op.ranks) if op else list(self.membership.members)
        when = op.start if op else 0
        root = op.combine if op and isinstance(op.combine, int) else None
        cost = self.network.collective(kind, size, ranks, lambda r: self.links.nic(r, when),
                                       root)
        return to_ns(cost.seconds) + self.links.delays(cost.crossing)

    def _complete(self, seq: int, op: Collective, finish: int) -> None:
        op.end = finish
        del self.collectives[seq]
        for rank in op.waiting:
            self.scheduler.wake(rank, op.end)

    def post(self, src: int, dst: int, tensor: torch.Tensor, tag: int | None = None,
             droppable: bool = False, copy: bool = True, to: int | None = None) -> int | None:
        """Put `tensor` on src's link to dst: to the matching `recv` (tag None) or to dst's
        mailbox or handler for `tag`. A message to oneself arrives at once. `copy` False:
        the tensor itself travels (the sender will not change it, nor will the receivers).
        `to`: the process standing for dst it is meant for, by its join step (default: the
        one now); it is lost if another stands there when it arrives. Returns when its last
        byte leaves src's uplink (ns; None for a message to oneself)."""
        to = self.membership.since[dst] if to is None else to
        sender = (src, self.membership.since[src])
        size = nbytes(tensor) if tag is None else frame_bytes(tensor)
        now = self.scheduler.now(src) if self.handling_at is None else self.handling_at
        payload = tensor.detach() if tag is None else tensor.detach().reshape(-1)
        payload = payload.clone() if copy else payload
        if tag is None:
            self.in_transit[(src, dst)] += 1
        elif not droppable:
            self.coming[(src, dst, tag)] += 1
        if src == dst:
            self.scheduler.at(now, lambda: self._file(sender, dst, to, tag, payload, now))
            return None
        start, sent = self.links.depart(src, dst, size, now)

        def land() -> None:  # at `start`: downlinks take messages in the order they come
            arrival = self.links.land(src, dst, size, start, sent, droppable)
            if arrival is not None:
                self.scheduler.at(arrival,
                                  lambda: self._file(sender, dst, to, tag, payload, arrival))

        self.scheduler.at(start, land)
        return sent

    def _file(self, sender: tuple[int, int], dst: int, to: int, tag: int | None,
              payload: torch.Tensor, arrival: int) -> None:
        """A message arrives: to its handler, or queued, waking dst if it waits for it.
        A message to a process that has crashed is lost. `sender`: (src, its process)."""
        src = sender[0]
        if tag is None:
            self.in_transit[(src, dst)] -= 1
        elif (src, dst, tag) in self.coming:
            self.coming[(src, dst, tag)] -= 1
        if not self.membership.accepts(dst, to):
            return
        handler = self.handlers.get((dst, tag)) if tag is not None else None
        if handler is not None:
            # the handler works on dst's behalf, one message after another; its replies
            # leave when it is done
            start = max(arrival, self.server_free[dst])
            self.handling_at = self.server_free[dst] = start + self.compute.reduce_ns(
                frame_bytes(payload))
            self.replying = sender
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
