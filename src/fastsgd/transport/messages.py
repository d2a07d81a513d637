"""Asynchronous messages between real processes: a background receiver thread.

Asynchronous strategies (parameter server, asynchronous gossip, push-sum) need to receive
whatever has arrived, from anyone, without a matching call on the sender's side. Each
process runs one receiver thread on a dedicated gloo group: it takes frames (header, then
payload; see frames.py) from any peer and files them by tag; the training thread reads them
with `poll` (never blocks) or `wait` (blocks for one). Sends are non-blocking.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque

import torch
import torch.distributed as dist

from fastsgd.transport import frames

HEADER_TAG, PAYLOAD_TAG = 101, 102


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
        self.mailbox = Mailbox()
        self._on_receive = on_receive
        self._pending: list[dist.Work] = []
        self._thread = threading.Thread(target=self._receive_loop, daemon=True,
                                        name=f"fastsgd-receiver-{rank}")
        self._thread.start()

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        payload = tensor.detach().reshape(-1).contiguous().cpu()
        self._pending = [w for w in self._pending if not w.is_completed()]
        self._pending.append(dist.isend(frames.header(payload, tag), dst, self.group,
                                        tag=HEADER_TAG))
        self._pending.append(dist.isend(payload, dst, self.group, tag=PAYLOAD_TAG))

    def _receive_loop(self) -> None:
        while True:
            words = torch.empty(frames.HEADER_WORDS, dtype=torch.int64)
            try:
                src = dist.recv(words, group=self.group, tag=HEADER_TAG)
                tag, numel, dtype = frames.parse(words, src)
                if tag == frames.STOP_TAG:
                    return
                payload = torch.empty(numel, dtype=dtype)
                dist.recv(payload, src, self.group, tag=PAYLOAD_TAG)
            except BaseException as e:  # noqa: BLE001 - handed to the training thread
                self.mailbox.fail(e)
                return
            self._on_receive(frames.frame_bytes(payload))
            self.mailbox.put(tag, src, payload)

    def close(self) -> None:
        """Collective: wait until every frame is delivered, then stop the receivers."""
        for work in self._pending:
            work.wait()
        dist.barrier(group=self.group)
        stop = torch.zeros(0)
        right = (self.rank + 1) % self.world_size
        dist.isend(frames.header(stop, frames.STOP_TAG), right, self.group,
                   tag=HEADER_TAG).wait()
        self._thread.join(timeout=30)
