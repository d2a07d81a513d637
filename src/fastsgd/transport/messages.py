"""Asynchronous messages between real processes: a background receiver thread.

Asynchronous strategies (parameter server, asynchronous gossip, push-sum) need to receive
whatever has arrived, from anyone, without a matching call on the sender's side. Each
process runs one receiver thread on a dedicated gloo group: it takes frames (header, then
payload; see frames.py) from any peer and files them by tag; the training thread reads them
with `poll` (never blocks) or `wait` (blocks for one). Sends are non-blocking. A tag can
instead have a handler (`serve`), which the receiver thread runs for each message as it
arrives: a parameter server's shard answers pushes and fetches while its rank trains.
A message to oneself is handed over directly, without the network.

The receiver thread shares the interpreter lock with the training thread. Each frame hands
the lock over a few times (the receiver wakes, files the frame, blocks again); with Python's
default switch interval (5 ms) a waiting thread may sit idle that long before the lock is
handed over (in a two-process test, a step of 2 ms of work and one message each way took
7.0-7.5 ms; docs/strategies.md, "Stragglers"). So the receiver talks to the process group
directly (no per-call wrapper code under the lock), reuses its header buffer, and
`start_messages` lowers the switch interval to `SWITCH_INTERVAL`.
"""

from __future__ import annotations

import sys
import threading
from collections import defaultdict, deque
from collections.abc import Callable

import torch
import torch.distributed as dist

from fastsgd.transport import frames

HEADER_TAG, PAYLOAD_TAG = 101, 102
SWITCH_INTERVAL = 0.0005  # s: how long a thread waits for the interpreter lock before asking


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
    """Sends frames and runs the receiver thread of one process (see module docstring)."""

    def __init__(self, rank: int, world_size: int, on_receive):
        self.rank, self.world_size = rank, world_size
        self.group = dist.new_group(backend="gloo")  # collective: every rank creates it
        # group ranks are the global ranks (the group holds every rank, in order)
        self.mailbox = Mailbox()
        self._on_receive = on_receive
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []  # keep buffers until sent
        self._send_lock = threading.Lock()  # the training and receiver threads both send
        self.handlers: dict[int, Callable[[int, torch.Tensor], None]] = {}
        self._thread = threading.Thread(target=self._receive_loop, daemon=True,
                                        name=f"fastsgd-receiver-{rank}")
        if world_size > 1:  # alone, a process only ever messages itself
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
            self._thread.start()

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        payload = tensor.detach().reshape(-1).contiguous().cpu()
        if dst == self.rank:
            self._dispatch(tag, dst, payload.clone())
            return
        with self._send_lock:
            self._pending = [(w, b) for w, b in self._pending if not w.is_completed()]
            header = frames.header(payload, tag)
            self._pending.append((self.group.send([header], dst, HEADER_TAG), header))
            self._pending.append((self.group.send([payload], dst, PAYLOAD_TAG), payload))

    def _dispatch(self, tag: int, src: int, payload: torch.Tensor) -> None:
        handler = self.handlers.get(tag)
        if handler is None:
            self.mailbox.put(tag, src, payload)
        else:
            handler(src, payload)

    def _receive_loop(self) -> None:
        words = torch.empty(frames.HEADER_WORDS, dtype=torch.int64)  # parsed before reuse
        while True:
            try:
                work = self.group.recv_anysource([words], HEADER_TAG)
                work.wait()
                src = work._source_rank()
                tag, numel, dtype = frames.parse(words, src)
                if tag == frames.STOP_TAG:
                    return
                payload = torch.empty(numel, dtype=dtype)
                self.group.recv([payload], src, PAYLOAD_TAG).wait()
                self._on_receive(frames.frame_bytes(payload))
                self._dispatch(tag, src, payload)
            except BaseException as e:  # noqa: BLE001 - handed to the training thread
                self.mailbox.fail(e)
                return

    def close(self) -> None:
        """Collective: wait until every frame is delivered, then stop the receivers."""
        if self.world_size == 1:
            return
        with self._send_lock:
            pending = list(self._pending)
        for work, _ in pending:
            work.wait()
        dist.barrier(group=self.group)
        stop = torch.zeros(0)
        right = (self.rank + 1) % self.world_size
        dist.isend(frames.header(stop, frames.STOP_TAG), right, self.group,
                   tag=HEADER_TAG).wait()
        self._thread.join(timeout=30)
