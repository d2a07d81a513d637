"""Asynchronous messages between real processes: one plain TCP connection per pair of workers.

Asynchronous strategies (parameter server, asynchronous gossip, push-sum) need to receive
whatever has arrived, from anyone, without a matching call on the sender's side. A message
is a frame, a header then a payload (frames.py), on the connection between the two workers.
Each connection has a sender thread with a queue, so sends never block the training thread,
and one reader thread serves every connection: it reads whatever has arrived, files each
whole frame by tag, or hands it to the tag's handler (`serve`: a parameter server's shard
answers pushes and fetches while its rank trains). The training thread takes messages with
`poll` (never blocks) or `wait` (blocks for one). A message to oneself never leaves the
process. Per sender, frames arrive in the order sent (one TCP stream).

Why not gloo, which carried these messages before: gloo sends a payload only once the
receiver's "ready" notice has come, and that notice queues behind whatever its side is
already sending, so the two directions of a link took turns unless receives were posted far
ahead (three groups and a header thread did that, and still left the links idle part of the
time on 3-4 emulated hosts: docs/multihost.md). TCP needs no notice: both directions of every
connection carry data at once. And a connection that ends without a goodbye frame is a peer
that died: the waits that expect its messages fail at once with PeerLost, where gloo waited
for its timeout.

The receiver threads share the interpreter lock with the training thread; each frame hands
it over a few times, and with Python's default switch interval (5 ms) a waiting thread may
sit idle that long: the messenger shortens it to SWITCH_INTERVAL.
"""

from __future__ import annotations

import queue
import selectors
import socket
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

import torch

from fastsgd.transport import frames
from fastsgd.transport.base import PeerLost
from fastsgd.transport.connections import connect

SWITCH_INTERVAL = 0.0005  # s: how long a thread waits for the interpreter lock before asking
GOODBYE_TAG = frames.STOP_TAG


class Mailbox:
    """Messages filed by tag, shared by the reader thread and the training thread, and the
    peers whose connection ended without a goodbye (lost)."""

    def __init__(self):
        # per tag: (sender, payload, the sender's step)
        self._queues: dict[int, deque[tuple[int, torch.Tensor, int]]] = defaultdict(deque)
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self.lost: dict[int, float] = {}  # rank -> time.perf_counter() it was found lost
        self._told: set[int] = set()  # the lost that a wait for any sender has reported
        self.on_lost: Callable[[int], None] | None = None  # called once per peer found lost
        self.finished: set[int] = set()  # the peers whose goodbye came

    def put(self, tag: int, src: int, payload: torch.Tensor, step: int = 0) -> None:
        with self._cond:
            self._queues[tag].append((src, payload, step))
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = self._error or error
            self._cond.notify_all()

    def lose(self, rank: int) -> None:
        with self._cond:
            new = rank not in self.lost
            self.lost.setdefault(rank, time.perf_counter())
            self._cond.notify_all()
        if new and self.on_lost is not None:
            self.on_lost(rank)

    def finish(self, rank: int) -> None:
        with self._cond:
            self.finished.add(rank)

    def done(self) -> set[int]:
        """The peers that said goodbye: they ended their part of the run."""
        with self._cond:
            return set(self.finished)

    def lost_now(self) -> dict[int, float]:
        """A copy of `lost` (the reader and sender threads add to it)."""
        with self._cond:
            return dict(self.lost)

    def take_all(self, tag: int) -> list[tuple[int, torch.Tensor]]:
        with self._cond:
            self._raise()
            out = [(src, payload) for src, payload, _ in self._queues[tag]]
            self._queues[tag].clear()
            return out

    def take_one(self, tag: int, timeout: float, src: int | None = None
                 ) -> tuple[int, torch.Tensor]:
        """The next message with `tag` (from `src` if given). PeerLost when `src` is lost and
        nothing of it is left; without `src`, when peers were found lost since the last such
        report (not only since this call began: the caller counted what it expects before
        calling, and a loss in between would leave it waiting for good)."""
        src, payload, _ = self._take(tag, timeout, src, None)
        return src, payload

    def take_step(self, tag: int, src: int, step: int, timeout: float
                  ) -> tuple[int, torch.Tensor]:
        """The first message with `tag` from `src` sent at `step` or before, as (the step it
        was sent at, payload); later ones wait. PeerLost as take_one."""
        _, payload, sent_at = self._take(tag, timeout, src, step)
        return sent_at, payload

    def _take(self, tag: int, timeout: float, src: int | None, upto: int | None
              ) -> tuple[int, torch.Tensor, int]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready(tag, src, upto), timeout):
                raise TimeoutError(f"no message with tag {tag} within {timeout} s")
            self._raise()
            found = self._find(tag, src, upto)
            if found is None:
                news = [src] if src is not None else sorted(set(self.lost) - self._told)
                self._told.update(news)
                raise PeerLost(news)
            message = self._queues[tag][found]
            del self._queues[tag][found]
            return message

    def _find(self, tag: int, src: int | None, upto: int | None = None) -> int | None:
        for i, (sender, _, step) in enumerate(self._queues[tag]):
            if (src is None or sender == src) and (upto is None or step <= upto):
                return i
        return None

    def _ready(self, tag: int, src: int | None, upto: int | None) -> bool:
        if self._error is not None or self._find(tag, src, upto) is not None:
            return True
        return src in self.lost if src is not None else bool(set(self.lost) - self._told)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error


class _Link:
    """The connection to one peer: its sender thread's queue, and the frame being read."""

    def __init__(self, sock: socket.socket, peer: int):
        self.sock, self.peer = sock, peer
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.header = torch.empty(frames.HEADER_WORDS, dtype=torch.int64)
        self.expect_header()

    def expect_header(self) -> None:
        self.payload: tuple[int, torch.Tensor] | None = None  # (tag, tensor) once known
        self.view, self.got = frames.as_bytes(self.header), 0

    def expect_payload(self, tag: int, payload: torch.Tensor) -> None:
        self.payload, self.view, self.got = (tag, payload), frames.as_bytes(payload), 0


class Messenger:
    """Connections to every peer, their sender threads and the reader thread of one process
    (see the module docstring). `store`: the job's key-value store, where each rank
    publishes the address it listens on (`host`, a free port) under `key`. `on_receive(tag,
    payload)` is told of every frame from a peer as it arrives (to count bytes)."""

    def __init__(self, rank: int, world_size: int,
                 on_receive: Callable[[int, torch.Tensor], None],
                 store, key: str, host: str, timeout: float = 300.0):
        self.rank, self.world_size = rank, world_size
        self.mailbox = Mailbox()
        self._on_receive = on_receive
        self._handlers: dict[int, Callable[[int, torch.Tensor], None]] = {}
        # held while a message is filed or handled: a handler takes its tag's messages one
        # at a time and in order, those filed before it was registered first (reentrant: a
        # handler may message its own rank)
        self._dispatch_lock = threading.RLock()
        self.last_step: dict[int, int] = {}  # per peer: the step of its last whole frame
        self._links = {peer: _Link(sock, peer) for peer, sock
                       in connect(rank, world_size, store, key, host, timeout).items()}
        self._selector = selectors.DefaultSelector()
        for link in self._links.values():
            self._selector.register(link.sock, selectors.EVENT_READ, link)
        self._threads = [threading.Thread(target=self._send_loop, args=(link,), daemon=True,
                                          name=f"fastsgd-send-{rank}-{link.peer}")
                         for link in self._links.values()]
        self._threads.append(threading.Thread(target=self._read_loop, daemon=True,
                                              name=f"fastsgd-read-{rank}"))
        if world_size > 1:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        for thread in self._threads:
            thread.start()

    def send(self, tensor: torch.Tensor, dst: int, tag: int, step: int = 0) -> torch.Tensor:
        """Queue `tensor` for `dst`, stamped with the sender's `step`; returns the copy sent
        (the caller may change `tensor` at once, the sender thread sends it later)."""
        payload = tensor.detach().reshape(-1).to("cpu", copy=True).contiguous()
        if dst == self.rank:
            self._dispatch(tag, dst, payload, step)
        elif dst not in self.mailbox.lost:  # a lost peer takes nothing more
            self._links[dst].outbox.put((frames.header(payload, tag, step), payload))
        return payload

    def serve(self, tag: int, handler: Callable[[int, torch.Tensor], None]) -> None:
        """Hand every message with `tag` to `handler` from now on, starting with those already
        filed: peers may message this rank as soon as `start_messages` returns everywhere,
        before it registers its handlers (a parameter server lost such early fetches, and
        the workers waiting for their replies hung)."""
        with self._dispatch_lock:
            self._handlers[tag] = handler
            for src, payload in self.mailbox.take_all(tag):
                handler(src, payload)

    def _dispatch(self, tag: int, src: int, payload: torch.Tensor, step: int = 0) -> None:
        with self._dispatch_lock:
            handler = self._handlers.get(tag)
            if handler is None:
                self.mailbox.put(tag, src, payload, step)
            else:
                handler(src, payload)

    def _send_loop(self, link: _Link) -> None:
        """Frames to one peer, in the order queued; None: send the goodbye, stop. A peer that
        is gone takes nothing more (as for a crashed worker in the simulator)."""
        try:
            while (frame := link.outbox.get()) is not None:
                header, payload = frame
                link.sock.sendall(frames.as_bytes(header))
                if payload.numel():
                    link.sock.sendall(frames.as_bytes(payload))
            link.sock.sendall(frames.as_bytes(frames.header(torch.zeros(0), GOODBYE_TAG)))
        except OSError:
            self.mailbox.lose(link.peer)

    def _read_loop(self) -> None:
        """Read whatever has arrived on any connection until every peer said goodbye or is
        gone; file or hand over each whole frame."""
        try:
            while self._selector.get_map():
                for key, _ in self._selector.select():
                    self._read(key.data)
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            self.mailbox.fail(e)

    def _read(self, link: _Link) -> None:
        try:
            got = link.sock.recv_into(link.view[link.got:])
        except OSError:
            got = 0
        if got == 0:  # the connection ended before a goodbye: the peer died
            self._selector.unregister(link.sock)
            self.mailbox.lose(link.peer)
            return
        link.got += got
        if link.got < len(link.view):
            return
        if link.payload is None:
            tag, numel, dtype = frames.parse(link.header, link.peer)
            if tag == GOODBYE_TAG:
                self._selector.unregister(link.sock)
                self.mailbox.finish(link.peer)
                return
            link.expect_payload(tag, torch.empty(numel, dtype=dtype))
            if numel:
                return
        tag, payload = link.payload
        # only now: a frame cut short by its sender's death was never sent
        step = self.last_step[link.peer] = frames.step_of(link.header)
        link.expect_header()
        self._on_receive(tag, payload)
        self._dispatch(tag, link.peer, payload, step)

    def close(self, timeout: float = 30.0) -> None:
        """Collective: send every queued frame and a goodbye to each peer, wait until each
        peer's goodbye came (so everything sent here was delivered) or it is gone."""
        for link in self._links.values():
            link.outbox.put(None)
        for thread in self._threads:
            thread.join(timeout)
        self._selector.close()
        for link in self._links.values():
            link.sock.close()
