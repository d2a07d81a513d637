"""Asynchronous messages between real processes: background receiver threads.

Asynchronous strategies (parameter server, asynchronous gossip, push-sum) need to receive
whatever has arrived, from anyone, without a matching call on the sender's side. A message
is a header then a payload (see frames.py). Each process runs two receiver threads on
dedicated gloo groups: one takes headers from any peer and posts the receive of each
payload, the other waits for the payloads in that order and files them by tag; the training
thread reads them with `poll` (never blocks) or `wait` (blocks for one). Sends are
non-blocking. A tag can instead have a handler (`serve`), which the payload thread runs for
each message as it arrives: a parameter server's shard answers pushes and fetches while its
rank trains. A message to oneself is handed over directly, without the network.

The receiver threads share the interpreter lock with the training thread. Each frame hands
the lock over a few times (a receiver wakes, files the frame, blocks again); with Python's
default switch interval (5 ms) a waiting thread may sit idle that long before the lock is
handed over (in a two-process test, a step of 2 ms of work and one message each way took
7.0-7.5 ms; docs/strategies.md, "Stragglers"). So the receivers talk to the process groups
directly (no per-call wrapper code under the lock), reuse the header buffer, and
`start_messages` lowers the switch interval to `SWITCH_INTERVAL`.

Three groups keep the messages full duplex. Gloo writes a payload only once the receiver's
"ready" notice for it has arrived (sent when the receiver posts the payload's receive, after
its header has come), and a group holds one TCP connection per pair of ranks. With one group
for everything, the notice a rank sends for its peer's payload queued behind that rank's own
outgoing payload on the same connection, and the two directions of a link took turns. So
payloads to a higher rank travel on `up`, to a lower rank on `down` (each connection carries
one direction's payloads and the other direction's notices only), and headers on `control`,
where they do not queue behind payloads: the header thread learns of the next messages and
posts their receives (up to `AHEAD`) while a payload is still arriving, so the notices run
ahead of the data. All frames from one rank to another use the same groups, and payloads
are delivered in their headers' order: per sender, in the order sent. Between two emulated
hosts at 20 Mbit/s each way (benchmarks/netns.py), sgp on 2 workers (340 KB each way per
step) took 0.329 s per step with one group and 0.194 s with three (simulated: 0.171 s);
3 workers 0.399 -> 0.273 s. One 340 KB message each way at once, with the links idle
before, took 0.273 s with one group and 0.14-0.26 s (median of the slower side 0.20 s) with
three, against 0.142 s one way: a notice that leaves after the other direction's data has
started still waits behind that data in the link's queue (plain gloo, all receives posted
before any send, 0.144 s).
"""

from __future__ import annotations

import queue
import sys
import threading
from collections import defaultdict, deque
from collections.abc import Callable

import torch
import torch.distributed as dist

from fastsgd.transport import frames

HEADER_TAG, PAYLOAD_TAG = 101, 102
SWITCH_INTERVAL = 0.0005  # s: how long a thread waits for the interpreter lock before asking
AHEAD = 4  # payload receives posted ahead of delivery, at most (memory: AHEAD payloads)


class Mailbox:
    """Messages filed by tag, shared by the receiver thread and the training thread."""

    def __init__(self):
        self._queues: dict[int, deque[tuple[int, torch.Tensor]]] = defaultdict(deque)
        self._cond = threading.Condition()
        self._error: BaseException | None = None

    def put(self, tag: int, src: int, payload: torch.Tensor) -> None:
        with self._cond:
            self._queues[tag].append((src, payload))
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def take_all(self, tag: int) -> list[tuple[int, torch.Tensor]]:
        with self._cond:
            self._raise()
            queue = self._queues[tag]
            out = list(queue)
            queue.clear()
            return out

    def take_one(self, tag: int, timeout: float) -> tuple[int, torch.Tensor]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._error or self._queues[tag], timeout):
                raise TimeoutError(f"no message with tag {tag} within {timeout} s")
            self._raise()
            return self._queues[tag].popleft()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error


class Messenger:
    """Sends frames and runs the receiver threads of one process (see module docstring)."""

    def __init__(self, rank: int, world_size: int, on_receive):
        self.rank, self.world_size = rank, world_size
        # collective: every rank creates the three, in this order; their group ranks are the
        # global ranks (each group holds every rank, in order)
        self.control = dist.new_group(backend="gloo")  # headers, both ways
        self.up = dist.new_group(backend="gloo")  # payloads to a higher rank
        self.down = dist.new_group(backend="gloo")  # payloads to a lower rank
        self.mailbox = Mailbox()
        self._on_receive = on_receive
        # sends in flight, with their buffers, until the sent thread has seen them out: a gloo
        # send's Work reports completion only once waited for, so keeping them until
        # `is_completed()` kept every payload ever sent (1 MB per step per worker for an
        # MLP's sgp, until the machine ran out of memory)
        self._sent: queue.SimpleQueue = queue.SimpleQueue()
        self._send_lock = threading.Lock()  # the training and receiver threads both send
        self._handlers: dict[int, Callable[[int, torch.Tensor], None]] = {}
        # held while a message is filed or handled: a handler takes its tag's messages one
        # at a time and in order, those filed before it was registered first (reentrant: a
        # handler may message its own rank)
        self._dispatch_lock = threading.RLock()
        self._arrivals: queue.SimpleQueue = queue.SimpleQueue()  # posted payload receives
        self._slots = threading.Semaphore(AHEAD)  # taken by a posted receive until delivered
        self._delivering = True  # until the payload thread fails
        self._threads = [threading.Thread(target=loop, daemon=True, name=f"fastsgd-{name}-{rank}")
                         for loop, name in ((self._header_loop, "headers"),
                                            (self._payload_loop, "payloads"),
                                            (self._sent_loop, "sent"))]
        if world_size > 1:  # alone, a process only ever messages itself
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
            for thread in self._threads:
                thread.start()

    def data_group(self, src: int, dst: int):
        """The group of every payload from `src` to `dst` (one per pair: in order)."""
        return self.up if dst > src else self.down

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        payload = tensor.detach().reshape(-1).contiguous().cpu()
        if dst == self.rank:
            self._dispatch(tag, dst, payload.clone())
            return
        data = self.data_group(self.rank, dst)
        with self._send_lock:
            header = frames.header(payload, tag)
            self._sent.put((self.control.send([header], dst, HEADER_TAG), header))
            self._sent.put((data.send([payload], dst, PAYLOAD_TAG), payload))

    def serve(self, tag: int, handler: Callable[[int, torch.Tensor], None]) -> None:
        """Hand every message with `tag` to `handler` from now on, starting with those already
        filed: peers may message this rank as soon as `start_messages` returns everywhere,
        before it registers its handlers (a parameter server lost such early fetches, and
        the workers waiting for their replies hung)."""
        with self._dispatch_lock:
            self._handlers[tag] = handler
            for src, payload in self.mailbox.take_all(tag):
                handler(src, payload)

    def _dispatch(self, tag: int, src: int, payload: torch.Tensor) -> None:
        with self._dispatch_lock:
            handler = self._handlers.get(tag)
            if handler is None:
                self.mailbox.put(tag, src, payload)
            else:
                handler(src, payload)

    def _header_loop(self) -> None:
        """Take each header, post its payload's receive at once, queue it for delivery."""
        words = torch.empty(frames.HEADER_WORDS, dtype=torch.int64)  # parsed before reuse
        try:
            while True:
                work = self.control.recv_anysource([words], HEADER_TAG)
                work.wait()
                src = work._source_rank()
                tag, numel, dtype = frames.parse(words, src)
                if tag == frames.STOP_TAG:
                    return
                self._slots.acquire()
                if not self._delivering:
                    return
                payload = torch.empty(numel, dtype=dtype)
                posted = self.data_group(src, self.rank).recv([payload], src, PAYLOAD_TAG)
                self._arrivals.put((posted, tag, src, payload))
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            self.mailbox.fail(e)
        finally:
            self._arrivals.put(None)  # the payload thread delivers what is queued, then ends

    def _payload_loop(self) -> None:
        """Deliver payloads in the order their headers came (per sender: the order sent)."""
        try:
            while (arrival := self._arrivals.get()) is not None:
                posted, tag, src, payload = arrival
                posted.wait()
                self._on_receive(frames.frame_bytes(payload))
                self._dispatch(tag, src, payload)
                self._slots.release()
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            self.mailbox.fail(e)
            self._delivering = False
            self._slots.release()  # the header thread must not wait for this one: it ends

    def _sent_loop(self) -> None:
        """Wait for each send in turn, then let its buffer go; None: all sent, stop."""
        try:
            while (sent := self._sent.get()) is not None:
                sent[0].wait()
        except BaseException as e:  # noqa: BLE001 - handed to the training thread
            self.mailbox.fail(e)

    def close(self) -> None:
        """Collective: wait until every frame is delivered, then stop the receivers."""
        if self.world_size == 1:
            return
        with self._send_lock:
            self._sent.put(None)
        self._threads[2].join()
        dist.barrier(group=self.control)
        stop = torch.zeros(0)
        right = (self.rank + 1) % self.world_size
        dist.isend(frames.header(stop, frames.STOP_TAG), right, self.control,
                   tag=HEADER_TAG).wait()
        for thread in self._threads[:2]:
            thread.join(timeout=30)
