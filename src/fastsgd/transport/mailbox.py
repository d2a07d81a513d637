"""The mailbox of the messenger (messages.py): messages filed by tag until the training
thread takes them, and the peers found lost."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

import torch

from fastsgd.transport.base import PeerLost


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
        # rank -> the step before which nothing more comes from it (its process that would
        # send those ended, and the one in its place joined at that step)
        self.cut_at: dict[int, int] = {}

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

    def welcome(self, rank: int) -> None:
        """`rank` is connected again: a worker that joined in place of a lost one."""
        with self._cond:
            self.lost.pop(rank, None)
            self._told.discard(rank)
            self.finished.discard(rank)

    def cut(self, rank: int, step: int) -> None:
        """Nothing more will come from `rank` for the steps before `step`."""
        with self._cond:
            self.cut_at[rank] = max(step, self.cut_at.get(rank, 0))
            self._cond.notify_all()

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

    def take_one(self, tag: int, timeout: float, src: int | None = None, at: int | None = None
                 ) -> tuple[int, torch.Tensor]:
        """The next message with `tag` (from `src` if given). PeerLost when `src` is lost and
        nothing of it is left, or when the process standing for it at step `at` is gone and
        the one in its place joined later (cut); without `src`, when peers were found lost
        since the last such report (not only since this call began: the caller counted what
        it expects before calling, and a loss in between would leave it waiting for good)."""
        src, payload, _ = self._take(tag, timeout, src, None, at)
        return src, payload

    def take_step(self, tag: int, src: int, step: int, timeout: float
                  ) -> tuple[int, torch.Tensor]:
        """The first message with `tag` from `src` sent at `step` or before, as (the step it
        was sent at, payload); later ones wait. PeerLost as take_one."""
        _, payload, sent_at = self._take(tag, timeout, src, step, step)
        return sent_at, payload

    def _take(self, tag: int, timeout: float, src: int | None, upto: int | None,
              at: int | None) -> tuple[int, torch.Tensor, int]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready(tag, src, upto, at), timeout):
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

    def _ready(self, tag: int, src: int | None, upto: int | None, at: int | None) -> bool:
        if self._error is not None or self._find(tag, src, upto) is not None:
            return True
        if src is not None and at is not None and at < self.cut_at.get(src, 0):
            return True  # `_take` finds nothing: PeerLost
        return src in self.lost if src is not None else bool(set(self.lost) - self._told)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
