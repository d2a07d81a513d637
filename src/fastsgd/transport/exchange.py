"""Gossip rounds (`exchange`) between real processes on CPU, over the messenger's TCP
connections: both directions of every link at once.

gloo's send waits for the receiver's "ready" notice, which queues behind that side's own
outgoing data, so gloo's exchange left the links idle part of the time (3 emulated hosts,
ring, 20 Mbit/s: 0.37 s per step against 0.285 s for both links busy, docs/multihost.md).
A peer found dead ends the wait for its part at once.

Each message carries its sender's step, and a round takes each peer's message of its own
step. A peer's message of an earlier step means that peer closed the graph around a dead
worker one round before this worker did: the dead got its last message out to this worker
and not to that peer (kill -9 between its two sends), so each counts the dead as gone from
a different round (membership.py). This worker then answers with its own message of that
round, kept for the purpose, and drops the peer's: the peer completes its round, and both
go on in step. The two mixed differently in that one round (this one with the dead's last
message, the peer with this one's); the mixing matrix is doubly stochastic again from the
next round on.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import torch

from fastsgd.transport import frames
from fastsgd.transport.base import PeerLost
from fastsgd.transport.link import Posted
from fastsgd.transport.messages import Messenger

TAG = frames.EXCHANGE_TAG
KEEP = 2  # rounds whose outgoing message is kept: this one and the one before

Take = Callable[[int, int], tuple[int, torch.Tensor]]  # (src, step) -> (sent at, payload)


class Exchanges:
    """The gossip rounds of one worker; `take` waits for a message (the mailbox's
    take_step: PeerLost when its sender is gone)."""

    def __init__(self, messenger: Messenger, rank: int, world_size: int, take: Take):
        self.messenger, self.rank, self.world_size, self.take = messenger, rank, world_size, take
        self.kept: dict[int, torch.Tensor] = {}  # round -> what this worker sent in it

    def run(self, outgoing: list[tuple[int, torch.Tensor]], sources: list[int],
            like: torch.Tensor, step: int) -> tuple[dict[int, torch.Tensor], list[int]]:
        """Send and receive one round's messages: what came, by source, and the peers found
        lost, after every other part is done."""
        # the peer after this one first, as in the simulator: on a ring, each host's first
        # message then goes to a different host, and every downlink is busy from the start
        for dst, tensor in sorted(outgoing, key=lambda o: (o[0] - self.rank) % self.world_size):
            self.kept[step], posted = self.messenger.send(tensor, dst, TAG, step)
            self._kill_if_asked(step, posted)
        for old in [s for s in self.kept if s <= step - KEEP]:
            del self.kept[old]
        received, lost = {}, []
        for src in sources:
            try:
                received[src] = self._take(src, step).view_as(like)
            except PeerLost:
                lost.append(src)
        return received, lost

    def _kill_if_asked(self, step: int, posted: Posted) -> None:
        """Fault tests: FASTSGD_TEST_KILL=RANK:STEP:exchange kills this worker (kill -9) in
        step STEP once its first message of the round is out, before the next one."""
        if os.environ.get("FASTSGD_TEST_KILL") == f"{self.rank}:{step + 1}:exchange":
            posted.wait()  # the sender thread has written it
            os.kill(os.getpid(), signal.SIGKILL)

    def _take(self, src: int, step: int) -> torch.Tensor:
        while True:
            sent_at, payload = self.take(src, step)
            if sent_at == step:
                return payload
            if sent_at in self.kept:  # the peer healed a round earlier: see above
                self.messenger.send(self.kept[sent_at], src, TAG, sent_at)
