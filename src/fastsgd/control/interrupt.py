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

Under torchrun the workers agree on the step through the job's store instead: store_stop.py.
"""

from __future__ import annotations

import fcntl
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

from fastsgd.control.slots import ARRAYS, Slots
from fastsgd.control.store_stop import StoreStop

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


# what stops a run as Ctrl-C does: a scheduler's or `timeout`'s SIGTERM, a closed
# terminal's SIGHUP; the workers ignore them all, and the launcher stops them (forking.py)
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def catching(handler: Any = signal.default_int_handler,
             signals: tuple[int, ...] = STOPS) -> Iterator[None]:
    """`signals` (SIGINT, SIGTERM and SIGHUP) go to `handler` (by default: KeyboardInterrupt)
    while inside, in the main thread. Set explicitly because a process started in the
    background by a shell without job control inherits SIGINT ignored, and Python then
    leaves it ignored: Ctrl-C sent with kill would do nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, was in before.items():
            signal.signal(sig, was)


@contextmanager
def held() -> Iterator[None]:
    """A SIGINT while inside is raised as KeyboardInterrupt on leaving, in the main thread.
    For imports: one cut short can leave a third-party module half made (numpy's import,
    seen), which then fails later with an error of its own instead of "interrupted"."""
    asked: list[int] = []
    with catching(lambda *_: asked.append(1)):
        yield
    if asked:
        raise KeyboardInterrupt


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
