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

A worker that joins later in place of a lost one (`joining`) connects to every peer still
there; each peer's reader thread accepts it on the listener it kept open, and from then on
that rank's messages go to the new connection. What the lost one had sent still counts
(`departures`: the step after the last it sent, per connection that ended).

The receiver threads share the interpreter lock with the training thread; each frame hands
it over a few times, and with Python's default switch interval (5 ms) a waiting thread may
sit idle that long: the messenger shortens it to SWITCH_INTERVAL.
"""

from __future__ import annotations

import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable

import torch

from fastsgd.transport import frames
from fastsgd.transport.connections import connect, hello, rejoin
from fastsgd.transport.link import GOODBYE_TAG, Link, Posted, send_loop
from fastsgd.transport.mailbox import Mailbox

SWITCH_INTERVAL = 0.0005  # s: how long a thread waits for the interpreter lock before asking


class Messenger:
    """Connections to every peer, their sender threads and the reader thread of one process
    (see the module docstring). `store`: the job's key-value store, where each rank
    publishes the address it listens on (`host`, a free port) under `key`. `on_receive(tag,
    payload)` is told of every frame from a peer as it arrives (to count bytes). `joining`:
    the step from which this process takes the place of a lost worker in a running job
    (None: it is there from the start); `accept`: the listener
    stays open for such workers (run.rejoin)."""

    def __init__(self, rank: int, world_size: int,
                 on_receive: Callable[[int, torch.Tensor], None],
                 store, key: str, host: str, timeout: float = 300.0,
                 joining: int | None = None, accept: bool = False):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.joined_at = joining or 0
        self.mailbox = Mailbox()
        self._on_receive = on_receive
        self._handlers: dict[int, Callable[[int, torch.Tensor], None]] = {}
        # held while a message is filed or handled: a handler takes its tag's messages one
        # at a time and in order, those filed before it was registered first (reentrant: a
        # handler may message its own rank)
        self._dispatch_lock = threading.RLock()
        self._departures: dict[int, list[tuple[int, float]]] = {}  # departures()
        socks, self._listener = (
            connect(rank, world_size, store, key, host, timeout) if joining is None
            else rejoin(rank, world_size, store, key, host, timeout, joining))
        self._links: dict[int, Link] = {}
        self._selector = selectors.DefaultSelector()
        if accept:
            self._selector.register(self._listener, selectors.EVENT_READ, None)
        else:
            self._listener.close()
        self._retired: list[Link] = []  # lost ones' connections that joiners replaced
        self._threads: list[threading.Thread] = []
        self._closing = False
        # per rank a new worker will join as: what was sent to it before it connected
        self._held: dict[int, list[tuple[torch.Tensor, torch.Tensor, int]]] = {}
        self._expected: dict[int, int] = {}  # per rank: the joins announced (expect)
        self._arrived: dict[int, int] = {}  # per rank: the joiners connected (_accept)
        self._joins: dict[int, int] = {}  # per rank: the step its latest joiner joins at
        self._links_lock = threading.Lock()  # the links and _held, between the threads
        if world_size > 1:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        for peer, sock in socks.items():
            self._attach(peer, sock)
        for peer in set(range(world_size)) - set(socks) - {rank}:
            self.mailbox.lose(peer)  # a joiner found it gone
            self._departures.setdefault(peer, [])
        self._threads.append(threading.Thread(target=self._read_loop, daemon=True,
                                              name=f"fastsgd-read-{rank}"))
        self._threads[-1].start()

    def _attach(self, peer: int, sock: socket.socket, joined_at: int | None = None) -> None:
        """A connection to `peer`, from the start or from a worker that joined in place of a
        lost one at step `joined_at`: its messages go there from now on."""
        with self._links_lock:
            old = self._links.get(peer)
            link = self._links[peer] = Link(sock, peer, joined_at or 0, self.joined_at)
            if old is not None:  # the lost one's: its sender thread ends, once it is not
                old.outbox.put(None)  # the rank's link (its failing goodbye would lose the rank)
                self._retired.append(old)
            self._arrived[peer] = self._arrived.get(peer, 0) + (joined_at is not None)
            for frame in self._held.pop(peer, []):
                link.outbox.put(frame)
            self.mailbox.welcome(peer)
            if joined_at is not None:
                self._joined(peer, joined_at)
        self._selector.register(sock, selectors.EVENT_READ, link)
        thread = threading.Thread(target=send_loop, args=(link, self._sender_failed), daemon=True,
                                  name=f"fastsgd-send-{self.rank}-{peer}")
        self._threads.append(thread)
        thread.start()

    def send(self, tensor: torch.Tensor, dst: int, tag: int,
             step: int = 0) -> tuple[torch.Tensor, Posted]:
        """Queue `tensor` for `dst`, stamped with the sender's `step`: the copy sent (the
        caller may change `tensor` at once, the sender thread sends it later) and a handle
        that waits until it is written."""
        payload = tensor.detach().reshape(-1).to("cpu", copy=True).contiguous()
        if dst == self.rank:
            self._dispatch(tag, dst, payload, step)
            return payload, Posted()
        header = frames.header(payload, tag, step)
        with self._links_lock:
            if dst in self._held:  # a new worker joins as dst: it gets it once connected
                self._held[dst].append((header, payload, 0))
            elif dst not in self.mailbox.lost:  # a lost peer takes nothing more
                link = self._links[dst]
                link.queued += 1
                link.outbox.put((header, payload, link.queued))
                return payload, Posted(link, link.queued, lambda: dst in self.mailbox.lost,
                                       self.timeout)
        return payload, Posted()

    def expect(self, rank: int, since: int) -> None:
        """A new worker will join as `rank` at step `since` (run.rejoin): from now on what is
        sent to it is held until it has connected, and waits for its messages of `since` on
        wait (it is not lost any more), also if the lost one's connection ends only after
        this."""
        with self._links_lock:
            self._expected[rank] = self._expected.get(rank, 0) + 1
            if self._arrived.get(rank, 0) < self._expected[rank]:
                self._held.setdefault(rank, [])
                self.mailbox.welcome(rank)
            self._joined(rank, since)

    def _joined(self, rank: int, since: int) -> None:
        """(Under _links_lock.) A worker joins as `rank` at step `since`: once every earlier
        process of the rank has been read to its end, waits for its messages of the steps
        before fail (PeerLost): nobody will send them. Else a wait for the lost one's
        message of a step before `since` that began before the joiner connected would
        wait for good (the joiner's connection welcomes the rank back)."""
        self._joins[rank] = since = max(since, self._joins.get(rank, 0))
        links = [link for link in [self._links.get(rank), *self._retired]
                 if link is not None and link.peer == rank and link.since < since]
        if all(link.ended for link in links):
            self.mailbox.cut(rank, since)

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

    def _sender_failed(self, link: Link) -> None:
        """A peer that is gone takes nothing more (as for a crashed worker in the
        simulator): lost, unless a joiner replaced it or is announced."""
        with self._links_lock:
            lost = self._is_lost(link)
        if lost:
            self.mailbox.lose(link.peer)

    def _is_lost(self, link: Link) -> bool:
        """(Under _links_lock.) Is `link`'s failure the loss of its rank: it is the rank's
        link, and no joiner replaced the process at its end or is announced?"""
        return (self._links.get(link.peer) is link and
                self._arrived.get(link.peer, 0) >= self._expected.get(link.peer, 0))

    def departures(self) -> dict[int, list[tuple[int, float]]]:
        """Per peer, each connection that ended without a goodbye: (the step after the last
        frame it brought that shows progress, when it was found lost, on
        time.perf_counter()); a copy (the reader thread adds to it)."""
        with self._links_lock:
            return {peer: list(left) for peer, left in self._departures.items()}

    def _read_loop(self) -> None:
        """Read whatever has arrived on any connection, and accept workers that join, until
        every peer said goodbye or is gone; file or hand over each whole frame."""
        try:
            while not self._closing or any(key.data is not None
                                           for key in self._selector.get_map().values()):
                for key, _ in self._selector.select(timeout=0.1):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            self.mailbox.fail(e)

    def _accept(self) -> None:
        """A worker joins in place of a lost one (FASTSGD_JOIN, launch.py). Whatever else
        connects (not a fastsgd worker, or too late) is closed."""
        sock, _ = self._listener.accept()
        try:
            peer, since = hello(sock, timeout=5.0)
        except Exception:  # noqa: BLE001 - a stranger: it does not stop this worker
            sock.close()
            return
        with self._dispatch_lock:
            if self._closing or not 0 <= peer < self.world_size or peer == self.rank:
                sock.close()
                return
            self._attach(peer, sock, joined_at=since)

    def _read(self, link: Link) -> None:
        try:
            got = link.sock.recv_into(link.view[link.got:])
        except OSError:
            got = 0
        if got == 0:  # the connection ended before a goodbye: the peer died
            self._selector.unregister(link.sock)
            with self._links_lock:  # lost, unless a joiner replaced it or is announced
                self._departures.setdefault(link.peer, []).append(
                    (link.last_step + 1, time.perf_counter()))
                link.ended = True
                lost = self._is_lost(link)
                if link.peer in self._joins:
                    self._joined(link.peer, self._joins[link.peer])
            if lost:
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
        step = frames.step_of(link.header)
        if frames.shows_progress(tag):
            link.last_step = step
        link.expect_header()
        self._on_receive(tag, payload)
        self._dispatch(tag, link.peer, payload, step)

    def close(self, timeout: float = 30.0) -> None:
        """Collective: send every queued frame and a goodbye to each peer, wait until each
        peer's goodbye came (so everything sent here was delivered) or it is gone."""
        with self._dispatch_lock:  # no joiner is attached from now on
            self._closing = True
            links = list(self._links.values())
        for link in links:
            link.outbox.put(None)
        for thread in list(self._threads):
            thread.join(timeout)
        self._selector.close()
        self._listener.close()
        for link in links + self._retired:
            link.sock.close()
