"""Ctrl-C under torchrun: every worker stops after the same step and writes a checkpoint,
as under `fastsgd run` (interrupt.py), but there is no launcher of ours and the workers may
be on several machines. A worker's first SIGINT (the terminal's, or the one torchrun's agent
forwards when it is interrupted) asks to stop, and the workers agree on the step through the
job's store: each publishes its progress every 0.1 s (longer beyond 200 workers, to spare the
store), and the first one asked sets the stop ahead of the furthest by what the fastest does
in three such periods. A thread of each worker does that, not its training thread: the
store's answers can queue behind the training's data on a busy link. A worker whose thread
learns the stop only after the worker went past it (a loaded machine runs the thread late)
raises it to its next step, and the others go on to that one."""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any


class StoreStop:
    """Ctrl-C under torchrun, agreed through `store` (the job's c10d store). One key holds
    the step to stop after; a worker already past it when it learns it raises it to the next
    step it will check; a worker stops only once every worker has counted in at the same step
    (one count per step), and goes on if the step is raised meanwhile."""

    LOOK_EVERY = 0.1  # s between looks at the store (one set and one check), for 200 workers
    AHEAD_LOOKS = 3  # the stop is proposed this many looks' worth of steps ahead
    WAIT_EVERY = 0.01  # s between looks while waiting at the stop for the others
    AGAIN_AFTER = 2.0  # s: a later SIGINT stops at once (torchrun's agent forwards the first)

    def __init__(self, store: Any, rank: int, world_size: int):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.key = f"fastsgd/stop/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.asked = 0.0  # when the first SIGINT came
        self.proposed = False
        self.stop_at = 0
        self.step = 0  # the last step done here: what the looks publish
        self.looked: tuple[float, int] | None = None  # (when, at which step): from the first
        self.rate = 0.0  # steps/s here, over the last look's period
        # no more than about 4000 store requests a second in all, however many workers
        self.every = self.LOOK_EVERY * max(1.0, world_size / 200)
        self._wake = threading.Event()  # a SIGINT: look now
        self._lock = threading.Lock()  # one of the two threads on the store at a time
        self._mark = threading.Lock()  # `step` and `stop_at`, as the training thread checks
        self._looker: threading.Thread | None = None
        self._failed: BaseException | None = None  # the looker's, raised in `after`
        self._closed = False

    def on_sigint(self, *_: Any) -> None:
        if self.asked and time.monotonic() - self.asked > self.AGAIN_AFTER:
            raise KeyboardInterrupt
        self.asked = self.asked or time.monotonic()
        self._wake.set()

    def after(self, rank: int, step: int) -> bool:
        """Step `step` is done: stop here? The looks at the store run in a thread of their
        own: on a busy link the store's answers queue behind the training's own data
        (0.05-0.2 s a look on emulated 20 Mbit/s hosts, docs/multihost.md), which the
        training thread must not wait for. Only at the stop does it use the store itself."""
        if self._looker is None:  # rates count from the first step done here, not setup
            self.looked = (time.monotonic(), step)
            self._looker = threading.Thread(target=self._look_loop, daemon=True,
                                            name=f"fastsgd-stop-{self.rank}")
            self._looker.start()
        if self._failed is not None:
            raise self._failed
        with self._mark:  # not while the looker learns the stop (`_learn`)
            self.step = step
            if not (self.stop_at and step >= self.stop_at):
                return False
        with self._lock:
            return self._all_in(step)

    def _look_loop(self) -> None:
        """Every `every` seconds, or at once on a SIGINT, until a stop is known."""
        try:
            while not (self.stop_at or self._closed):
                if not (self.asked and not self.proposed):
                    self._wake.wait(self.every)
                self._wake.clear()
                with self._lock:
                    if not (self.stop_at or self._closed):
                        self._look(self.step, time.monotonic())
        except BaseException as e:  # noqa: BLE001 - the store is gone: the training thread's
            self._failed = e

    def close(self) -> None:
        """The worker is done: no more looks (the store may go before this process). A look
        that hangs on a store already gone is left to end with the process."""
        self._closed = True
        self._wake.set()
        if self._looker is not None:
            self._looker.join(timeout=10.0)

    def _look(self, step: int, now: float) -> None:
        assert self.looked is not None
        if now - self.looked[0] >= self.every / 2:  # a look the SIGINT woke early measures
            # nothing: one step in its millisecond would read as a thousand a second, and the
            # stop would be proposed seconds ahead
            self.rate = (step - self.looked[1]) / (now - self.looked[0])
            self.looked = (now, step)
        self.store.set(f"{self.key}/at/{self.rank}", f"{step} {self.rate:.3f}")
        if self.asked and not self.proposed:
            self.proposed = True
            furthest, fastest = step, self.rate
            for r in range(self.world_size):
                key = f"{self.key}/at/{r}"
                if self.store.check([key]):
                    at, speed = self.store.get(key).decode().split()
                    furthest, fastest = max(furthest, int(at)), max(fastest, float(speed))
            ahead = 2 + math.ceil(fastest * self.AHEAD_LOOKS * self.every)
            self.store.compare_set(f"{self.key}/at", "", str(furthest + ahead))  # first wins
        if self.store.check([f"{self.key}/at"]):
            self._learn(int(self.store.get(f"{self.key}/at")))

    def _learn(self, stop_at: int) -> None:
        """The stop is `stop_at`. Where this worker has already checked a step at or past it
        (its look came late: a busy machine, a busy link), it raises the stop to the next
        step it will check, so that the others, waiting at the stop, go on to it: they wait
        for this one, and synchronous workers must not wait for each other twice (the stop
        and a collective). Under `_mark`: the training thread checks no step meanwhile."""
        with self._mark:
            if stop_at <= self.step:
                stop_at = self._raise_to(self.step + 1)
            self.stop_at = stop_at

    def _raise_to(self, step: int) -> int:
        """Raise the stop to `step` unless it is already there or beyond; what it is."""
        key = f"{self.key}/at"
        current = self.store.get(key)
        while int(current) < step:  # compare_set returns the value it leaves
            current = self.store.compare_set(key, current, str(step))
        return int(current)

    def _all_in(self, step: int) -> bool:
        """At or past the stop: count in here (past it: raise it to here first), then wait
        until every worker has, or the stop is raised (False: go on to it)."""
        key = f"{self.key}/at"
        self._raise_to(step)
        self.store.add(f"{self.key}/in/{step}", 1)
        while True:
            self.stop_at = int(self.store.get(key))
            if self.stop_at > step:
                return False
            if self.store.add(f"{self.key}/in/{step}", 0) >= self.world_size:
                return True
            time.sleep(self.WAIT_EVERY)
