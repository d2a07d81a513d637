"""One connection of the messenger (messages.py) to a peer: the sender thread's queue and
loop, the frame being read, and the handle of a message queued on it (Posted)."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable

import torch

from fastsgd.transport import frames

GOODBYE_TAG = frames.STOP_TAG


class Link:
    """The connection to one peer: its sender thread's queue, the frame being read, and the
    step of the last whole frame read that shows how far its sender got
    (frames.shows_progress)."""

    def __init__(self, sock: socket.socket, peer: int, since: int = 0, own: int = 0):
        self.sock, self.peer = sock, peer
        self.since = since  # the first step the process at the other end sends for
        self.ended = False  # read to its end: nothing more comes from that process
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        # frames numbered as queued; `written` the last one its sender thread has written
        # (`Posted.wait`), `closed` once that thread has ended and writes no more
        self.queued = self.written = 0
        self.closed = False
        self.progress = threading.Condition()
        self.header = torch.empty(frames.HEADER_WORDS, dtype=torch.int64)
        # a peer lost before it sent anything left, as far as this process can tell, when
        # either end joined (`own`: this process's join step)
        self.last_step = max(since, own) - 1
        self.expect_header()

    def expect_header(self) -> None:
        self.payload: tuple[int, torch.Tensor] | None = None  # (tag, tensor) once known
        self.view, self.got = frames.as_bytes(self.header), 0

    def expect_payload(self, tag: int, payload: torch.Tensor) -> None:
        self.payload, self.view, self.got = (tag, payload), frames.as_bytes(payload), 0


class Posted:
    """A message queued for a peer (Messenger.send): `wait()` returns once the sender thread
    has written it to the connection (frame `number` of `link`), or will not (the link
    ended, or the peer is lost); TimeoutError after `timeout` s of a connection that takes
    nothing (a peer that stopped reading). No link: delivered in-process, held for a joiner,
    or to a lost peer: nothing to wait for."""

    def __init__(self, link: Link | None = None, number: int = 0,
                 lost: Callable[[], bool] = lambda: False, timeout: float = 300.0):
        self.link, self.number, self.lost, self.timeout = link, number, lost, timeout

    def wait(self) -> None:
        link = self.link
        if link is None:
            return
        deadline = time.monotonic() + self.timeout
        with link.progress:
            while link.written < self.number and not link.closed and not self.lost():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"a message to worker {link.peer} was not written "
                                       f"within {self.timeout} s: the peer takes nothing")
                link.progress.wait(min(left, 1.0))  # and look whether the peer was lost


def send_loop(link: Link, failed: Callable[[Link], None]) -> None:
    """The sender thread of one link: frames in the order queued; None: send the goodbye,
    stop. `failed(link)` when the connection fails."""
    try:
        while (frame := link.outbox.get()) is not None:
            header, payload, number = frame
            link.sock.sendall(frames.as_bytes(header))
            if payload.numel():
                link.sock.sendall(frames.as_bytes(payload))
            if number:
                with link.progress:
                    link.written = number
                    link.progress.notify_all()
        link.sock.sendall(frames.as_bytes(frames.header(torch.zeros(0), GOODBYE_TAG)))
    except OSError:
        failed(link)
    finally:
        with link.progress:  # what is still queued will never be written: stop waiting
            link.closed = True
            link.progress.notify_all()
