"""The asynchronous messages of TorchTransport: posts, polls and takes over the messenger's
TCP connections (messages.py), and gossip exchanges on CPU over the same connections
(exchange.py). Kept apart from the collectives of torch_dist.py, whose class this mixin is
a base of.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from fastsgd.transport.base import Handle, PeerLost, PeerStalled
from fastsgd.transport.exchange import TAG as EXCHANGE_TAG
from fastsgd.transport.exchange import Exchanges
from fastsgd.transport.frames import frame_bytes
from fastsgd.transport.messages import Messenger
from fastsgd.transport.rendezvous import PeerGone, address_towards

if TYPE_CHECKING:
    from fastsgd.transport.shrink import Shrinking
    from fastsgd.transport.survivors import Survivors

_messengers_made = 0  # in this process: their store keys must not meet


class Messaging:
    """The message half of the Transport protocol (transport/base.py), for real processes;
    TorchTransport sets these fields and gives `store()` and `_count(sent, received)`."""

    rank: int
    world_size: int
    device: torch.device
    _step: int  # the step being computed: stamps messages
    _timeout: float
    _joins_at: int | None
    _messenger: Messenger | None
    _exchanges: Exchanges | None
    _survivors: Survivors | None
    _shrinking: Shrinking | None

    def start_messages(self) -> None:
        """Collective: connect to every peer for asynchronous messages (messages.py)."""
        if self._messenger is None:
            global _messengers_made
            _messengers_made += 1  # every rank makes its transports in the same order
            self._messenger = Messenger(self.rank, self.world_size, self._count_received,
                                        self.store(), f"fastsgd/messages/{_messengers_made}",
                                        address_towards(os.environ["MASTER_ADDR"]),
                                        self._timeout, joining=self._joins_at,
                                        accept=os.environ.get("FASTSGD_REJOIN") == "1")

    def post(self, tensor: torch.Tensor, dst: int, tag: int, droppable: bool = False) -> Handle:
        """Send an asynchronous message; the receiver takes it with poll or wait_message.
        Over TCP nothing is lost, `droppable` or not. The handle waits until it is written."""
        if dst != self.rank:  # a message to oneself never leaves the process
            self._count(frame_bytes(tensor), 0)
        return self._require_messages().send(tensor, dst, tag, self._step)[1]

    def serve(self, tag: int, handler) -> None:
        """Run `handler(src, payload)` for each message with `tag` as it arrives (on the
        receiver thread: the handler must guard what it shares with the training thread).
        Messages travel through host memory (TCP) and arrive on this worker's device."""
        device = self.device
        self._require_messages().serve(tag, lambda src, m: handler(src, m.to(device)))

    def poll(self, tag: int) -> list[tuple[int, torch.Tensor]]:
        """Every message with `tag` that has arrived, as (source rank, flat tensor)."""
        return [(src, m.to(self.device))
                for src, m in self._require_messages().mailbox.take_all(tag)]

    def wait_message(self, tag: int) -> tuple[int, torch.Tensor]:
        """Block until a message with `tag` arrives."""
        src, m = self._take(tag)
        return src, m.to(self.device)

    def _require_messages(self) -> Messenger:
        if self._messenger is None:
            raise RuntimeError("call start_messages() (collectively) before post/poll")
        return self._messenger

    def _count_received(self, tag: int, payload: torch.Tensor) -> None:
        # an exchange counts its payloads (when it completes), as the simulator does
        if tag != EXCHANGE_TAG:
            self._count(0, frame_bytes(payload))

    def _exchange_by_messages(self, outgoing: list[tuple[int, torch.Tensor]], sources: list[int],
                              like: torch.Tensor) -> dict[int, torch.Tensor]:
        """On CPU: over the messenger's connections (exchange.py)."""
        if self._exchanges is None:
            self.start_messages()
            mailbox = self._require_messages().mailbox
            self._exchanges = Exchanges(
                self._require_messages(), self.rank, self.world_size,
                lambda src, step: mailbox.take_step(EXCHANGE_TAG, src, step, self._timeout))
        try:
            received, lost = self._exchanges.run(outgoing, sources, like, self._step)
        except TimeoutError:
            raise PeerStalled(self.rank, self._timeout) from None
        if lost:
            raise self._lost(PeerLost(lost, received))
        return received

    def take_from(self, tag: int, src: int, step: int | None = None,
                  timeout: float | None = None) -> torch.Tensor:
        """The next message with `tag` from `src`; with `step`, one sent at that step or
        before. PeerLost when the process that would send it (standing for `src` at `step`,
        or at this step) is gone, even if another took its rank's place since.
        TimeoutError after `timeout` seconds (default: the transport's)."""
        return self._take(tag, src, step, timeout)[1].to(self.device)

    def _take(self, tag: int, src: int | None = None, step: int | None = None,
              timeout: float | None = None) -> tuple[int, torch.Tensor]:
        """The messenger's next message. A lost peer: PeerLost for workers that carry on
        without it (carry_on), else it ends this worker (PeerGone, one line), and `fastsgd
        run` or torchrun restart or stop every worker (supervise.py)."""
        mailbox, own = self._require_messages().mailbox, timeout is None
        timeout = timeout or self._timeout
        try:
            if step is None or src is None:
                return mailbox.take_one(tag, timeout, src, self._step)
            return src, mailbox.take_step(tag, src, step, timeout)[1]
        except PeerLost as e:
            raise self._lost(e) from None
        except TimeoutError:
            if not own:
                raise  # the caller's own short wait: it decides
            raise PeerStalled(self.rank, timeout, src) from None

    def _lost(self, error: PeerLost) -> RuntimeError:
        """PeerLost for workers that carry on without the lost (carry_on) or shrink, else
        PeerGone."""
        keep = self._survivors or self._shrinking
        return error if keep else PeerGone(f"{error} (its connection closed)")
