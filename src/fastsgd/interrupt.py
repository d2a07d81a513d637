"""Ctrl-C on `fastsgd run` and `fastsgd simulate`: every worker stops after the same step,
writes a checkpoint and exits, within seconds; then the launcher says how to resume.

The workers ignore SIGINT (a terminal sends it to the whole process group): a worker
interrupted at a random point could not take part in a checkpoint, which is a collective.
The launcher and its forked workers share two things in memory: each worker's progress
(the steps it has done, written after every step) and the step to stop at, 0 until the
launcher sets it. On Ctrl-C the launcher sets it a little ahead of the furthest worker:
two steps, plus the steps the workers make in 100 ms. Each worker records its step and reads
the stop under one lock, under which the launcher sets it, so none has gone past it by the
time it reads it (synchronous workers are within a step of each other; asynchronous ones
wait for the slowest in the checkpoint's barrier).

Under torchrun there is no launcher of ours and the workers may be on several machines
(`StoreStop`): a worker's first SIGINT (the terminal's, or the one torchrun's agent forwards
when it is interrupted) asks to stop, and the workers agree on the step through the job's
store, as above: each publishes its progress every 0.1 s (longer beyond 200 workers, to spare
the store), and the first one asked sets the stop ahead of the furthest by what the fastest
does in three such periods. A thread of each worker does that, not its training thread:
the store's answers can queue behind the training's data on a busy link. A worker whose
thread learns the stop only after the worker went past it (a loaded machine runs the thread
late) raises it to its next step, and the others go on to that one.
"""

from __future__ import annotations

import fcntl
import math
import os
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from fastsgd.slots import ARRAYS, Slots

# A new worker's exit status when the worker it was to take its state from was lost first:
# the launcher takes it for lost too, and starts another from a live worker (launch.py)
DONOR_LOST = 75

_SHARED: Stop | StoreStop | None = None  # set in each forked worker (launch.py), or torchrun's


class _Value:
    value = 0


class _ProcessLock:
    """A lock among the launcher, its forked workers and their threads that a holder's death
    releases: a worker killed (-9) inside a multiprocessing lock would leave every other
    worker and the launcher waiting for it for good. Each process takes a POSIX record lock
    (lockf) on one file: the kernel drops it with the process, and a process forked meanwhile
    (a joiner, a data loader's) does not inherit it. The file is unlinked as soon as it is
    made, so that nothing is left behind, even when the launcher is killed -9; the forked
    workers lock through the descriptor they inherit (record locks belong to processes, not
    to descriptors)."""

    def __init__(self, fd: int | None = None) -> None:
        if fd is None:
            fd, path = tempfile.mkstemp(prefix="fastsgd-lock-")
            os.unlink(path)
            weakref.finalize(self, _close_if_owner, fd, os.getpid())
        self._fd = fd
        self._pid, self._threads = -1, threading.Lock()

    def __enter__(self) -> None:
        if self._pid != os.getpid():  # forked: a thread lock of its own
            self._pid, self._threads = os.getpid(), threading.Lock()
        self._threads.acquire()  # lockf does not tell this process's threads apart
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
        except BaseException:  # a Ctrl-C in the launcher while it waits
            self._threads.release()
            raise

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)
        self._threads.release()


def _close_if_owner(fd: int, owner: int) -> None:
    if os.getpid() == owner:
        os.close(fd)


class Stop:
    """`ctx`: a multiprocessing context, shared with forked workers (in a file of the run
    directory at `path`, which processes from outside can map too: slots.py); None: one
    process (the simulator, whose workers are coroutines of one thread)."""

    def __init__(self, ctx: Any, workers: int, path: Path | None = None,
                 slots: Slots | None = None):
        self.slots = slots or (Slots(workers, path) if ctx else None)
        arrays = self.slots.arrays if self.slots else {
            name: [1 if name == "ready" else 0] * workers for name in ARRAYS}
        # the steps each worker has done (recorded as it starts and ends each step)
        self.progress = arrays["progress"]
        self.stop_at = self.slots.cell("stop_at") if self.slots else _Value()
        # 1 once a worker is connected to all its peers, so that they can go on without it
        self.ready = arrays["ready"]
        # the step from which a worker started again in place of a lost one is back (0: none)
        self.joined_at = arrays["joined_at"]
        self.donor = arrays["donor"]
        # the steps the last lost process of each rank had done, before a new one took over
        self.left_after = arrays["left_after"]
        # a worker records the step it starts and reads the steps set for it under this lock,
        # and the launcher sets them under it ahead of every recorded step: so no worker can
        # have gone past a step set for it before it reads it (a lost race would leave it,
        # say, donating a joiner's state never, or stopping never)
        self.lock = _ProcessLock(self.slots.fd) if self.slots else nullcontext()

    @classmethod
    def attach(cls, path: Path) -> Stop:
        """The Stop of a running launcher, from its file (run.join: door.py)."""
        return cls(None, 0, slots=Slots.attach(path))

    def request(self) -> int:
        """Set the step every worker stops after; returns it."""
        before = max(self.progress)
        time.sleep(0.02)
        with self.lock:
            now = max(self.progress)
            self.stop_at.value = now + 2 + 5 * (now - before)
            return self.stop_at.value

    def after(self, rank: int, step: int) -> bool:
        with self.lock:
            self.progress[rank] = step
            return self.stop_at.value == step

    def starting(self, rank: int, step: int) -> list[tuple[int, int]]:
        """A worker starts `step` (it has done as many): per rank, (joined_at, donor) as
        they are now, read together (a rank replaced again changes both)."""
        with self.lock:
            self.progress[rank] = step
            return list(zip(self.joined_at, self.donor))

    def settled(self, rank: int) -> bool:
        """Has the process standing for `rank` its state: it started with the run, or it
        joined and has done its first step since (a joiner still waiting for its donor's
        state has none to give)."""
        return not self.joined_at[rank] or self.progress[rank] > self.joined_at[rank]

    def rejoin(self, rank: int, donor: int, steps: int) -> int | None:
        """A worker starts again in place of lost `rank`, from `donor`'s state: the step it
        is back from, set ahead of the furthest worker (every worker reads it before it
        gets there, so all count it back from the same step); None when that is not before
        the run's last step (`steps`): then nothing is set."""
        before = max(self.progress)
        time.sleep(0.05)
        with self.lock:
            now = max(self.progress)
            # ahead by a quarter of a second of steps, at least 4: time to start the process;
            # after the one before of this rank: the workers tell returns apart by their step
            # (a replacement killed before the others got past its step would get it again)
            step = max(now + 4 + 5 * (now - before), self.joined_at[rank] + 1)
            if step >= steps:
                return None
            self.ready[rank] = 0  # until it is connected
            self.donor[rank] = donor
            self.left_after[rank] = max(self.progress[rank], self.joined_at[rank])  # joiner: J
            self.joined_at[rank] = step
            return step


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
        self.step = step
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
        rate = (step - self.looked[1]) / max(now - self.looked[0], 1e-3)  # steps/s
        self.looked = (now, step)
        self.store.set(f"{self.key}/at/{self.rank}", f"{step} {rate:.3f}")
        if self.asked and not self.proposed:
            self.proposed = True
            furthest, fastest = step, rate
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


def share(stop: Stop | StoreStop | None) -> None:
    """In a forked worker: this is the launcher's Stop (in the simulator: the one of
    `simulated`; None: none any more)."""
    global _SHARED
    _SHARED = stop


@contextmanager
def simulated(workers: int) -> Iterator[Stop]:
    """`fastsgd simulate`: Ctrl-C sets the step every simulated worker stops after, as the
    launcher of `fastsgd run` does; the workers write a checkpoint there and end."""
    stop = Stop(None, workers)
    share(stop)
    try:
        with catching(lambda *_: _again(stop)):
            yield stop
    finally:
        share(None)


@contextmanager
def catching(handler: Any = signal.default_int_handler) -> Iterator[None]:
    """SIGINT goes to `handler` (by default: KeyboardInterrupt) while inside, in the main
    thread. Set explicitly because a process started in the background by a shell without
    job control inherits SIGINT ignored, and Python then leaves it ignored: Ctrl-C sent with
    kill would do nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _again(stop: Stop) -> None:
    """The first Ctrl-C asks to stop; a second one stops at once (no checkpoint)."""
    if stop.stop_at.value:
        raise KeyboardInterrupt
    stop.request()


def set_ready(rank: int) -> None:
    """In a worker of `fastsgd run`: it is connected to all its peers, and they would learn
    of its death (before, they may be waiting for it in the rendezvous)."""
    if isinstance(_SHARED, Stop):
        _SHARED.ready[rank] = 1


def steps_done(rank: int) -> int | None:
    """How many steps worker `rank` has done, as the launcher's shared memory says (None
    outside `fastsgd run`'s own workers and `fastsgd simulate`): for a worker that died,
    where it stopped."""
    return int(_SHARED.progress[rank]) if isinstance(_SHARED, Stop) else None


def joining() -> tuple[int, int, int] | None:
    """In a worker started in place of a lost one: (the step it is back from, the rank whose
    state it starts from, the step that rank's process joined at: 0 for the first); None in
    any other worker."""
    spec = os.environ.get("FASTSGD_JOIN")
    return tuple(int(x) for x in spec.split(":")) if spec else None  # type: ignore[return-value]


def left_after(rank: int) -> int | None:
    """How many steps the last process of `rank` that a new one replaced had done, as the
    launcher's shared memory says (None outside `fastsgd run`'s workers)."""
    return int(_SHARED.left_after[rank]) if isinstance(_SHARED, Stop) else None


def starting(rank: int, step: int) -> list[tuple[int, int]]:
    """At the start of each step in `fastsgd run`'s workers: record it, and return per rank
    the step from which a worker that took a lost one's place is back (0: none; never one
    this worker has gone past: Stop.lock) and the rank whose state it starts from.
    [] outside `fastsgd run`'s workers."""
    return _SHARED.starting(rank, step) if isinstance(_SHARED, Stop) else []


def joined_at() -> list[int]:
    """Per rank, the step from which a worker that took a lost one's place is back (the
    latest such; 0: none), as the launcher set it; [] outside `fastsgd run`'s workers."""
    return list(_SHARED.joined_at) if isinstance(_SHARED, Stop) else []


def stop_after(rank: int, step: int) -> bool:
    """After each step: record it, and say whether Ctrl-C asks to stop here. Always False
    where nothing watches for it (a worker of the user's own loop)."""
    return _SHARED is not None and _SHARED.after(rank, step)
