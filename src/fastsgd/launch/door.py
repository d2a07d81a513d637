"""`fastsgd join RUN_DIR`: a process started from outside the launcher takes a lost worker's
place in a running `fastsgd run` (run.join), from a live worker's state (rejoin.py), as the
launcher's own new processes do under run.rejoin.

With run.join the launcher keeps what it shares with its workers (interrupt.Stop: each
worker's progress, the steps set for joins and for Ctrl-C) in `RUN_DIR/.door`, a file mapped
into memory (slots.py), so that a process that is not its child maps it too and counts in
at every step like the others. Its header names the launcher's pid and rendezvous port and
holds the door, one request slot under the file's lock:

1. a process that wants in writes its pid there when it is free, and waits (a standby:
   it has imported torch and loaded the data already);
2. the launcher, when a rank is vacant (a worker was lost and no one took its place), marks
   the request taken, sets the join step ahead of every worker as for its own new processes
   (Stop.rejoin) and answers with the rank; from then on it watches the process through a
   pidfd, as it watches its children, and counts its death as a loss;
3. the new worker clears the slot for the next one and joins (rejoin.join). When it ends it
   writes how (`ended`), which the launcher cannot learn otherwise of a process not its own.

When the run ends the launcher closes the door and removes the file; a standby then leaves.
Same machine only: the workers' addresses and this file are local.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

from fastsgd.control.interrupt import Stop
from fastsgd.control.slots import Slots
from fastsgd.errors import UserError
from fastsgd.records.rundir import DOOR

EVERY = 0.1  # s between looks at the door, on both sides
TAKEN = -1  # the answer while the launcher admits the request (it can no longer be withdrawn)
CLOSED = -2  # the answer when the run ends before the request could be admitted
ENDED_WELL, FAILED = 1, 2  # `ended`: how a process from outside ended (0: not told)
GONE, GONE_FAILED = -1000, -1001  # its exit code as the launcher tells it (forking.failure_of)


class Outside:
    """A worker process the launcher did not start: what launch.py uses of a Process."""

    def __init__(self, pid: int, rank: int, stop: Stop):
        self.pid, self.rank, self._stop = pid, rank, stop
        self.sentinel = os.pidfd_open(pid)  # readable once the process has ended
        self.exitcode: int | None = None

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is None and select.select([self.sentinel], [], [], timeout)[0]:
            ended = self._stop.slots.arrays["ended"][self.rank]
            self.exitcode = 0 if ended == ENDED_WELL else GONE_FAILED if ended else GONE

    def is_alive(self) -> bool:
        self.join(0)
        return self.exitcode is None

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass


class Door:
    """The launcher's side: `open` once the store serves, `admit` at every look, `close`
    at the end."""

    def __init__(self, path: Path, steps: int):
        self.path, self.steps = path, steps
        self.stop: Stop | None = None

    def open(self, stop: Stop, port: int,
             join_step: Callable[[int, list[int]], int | None]) -> None:
        """`join_step(rank, running)` sets the step a new process in `rank` joins at (None:
        the run ends first)."""
        self.stop, self.join_step = stop, join_step
        slots = stop.slots
        slots["started"] = started(os.getpid()) or 0  # before the pid: see _check_running
        slots["pid"], slots["port"], slots["steps"] = os.getpid(), port, self.steps

    def admit(self, vacant: list[int], running: list[int]) -> Outside | None:
        """The process at the door, if one asks, in the lowest vacant rank (when the run ends
        before it could join, the door closes)."""
        stop = self.stop
        if stop is None:
            return None
        slots = stop.slots
        with stop.lock:
            pid = slots["request"]
            if not pid or slots["answer"] or not vacant or not running:
                return None
            try:
                outside = Outside(pid, vacant[0], stop)
            except ProcessLookupError:  # it left without withdrawing
                slots["request"] = 0
                return None
            slots["answer"] = TAKEN
        step = self.join_step(vacant[0], running)
        with stop.lock:
            if step is None:
                slots["answer"], slots["closed"] = CLOSED, 1
                os.close(outside.sentinel)
                return None
            slots.arrays["ended"][vacant[0]] = 0
            slots["since"] = stop.joined_at[stop.donor[vacant[0]]]
            slots["answer"] = vacant[0] + 1
        return outside

    def close(self) -> None:
        if self.stop is not None:
            self.stop.slots["closed"] = 1
        self.path.unlink(missing_ok=True)


def attach(run_dir: Path) -> Stop:
    """The launcher's Stop of the run in `run_dir`, once its workers have started training
    (config.toml is whole then); UserError if no run there takes new workers."""
    stop = Stop.attach(run_dir / DOOR)
    while not max(stop.progress) and not stop.slots["closed"]:
        _check_running(stop.slots, run_dir)
        time.sleep(EVERY)
    _check_running(stop.slots, run_dir)
    return stop


def knock(stop: Stop, run_dir: Path, say: Callable[[str], None]) -> str | None:
    """The joiner's side: wait at the door of the run in `run_dir` (`attach`) for a place.
    Returns FASTSGD_JOIN's value for it with the rank first ("RANK:STEP:DONOR:SINCE");
    None when the run ended first."""
    slots, me = stop.slots, os.getpid()
    try:
        while not _request(stop, me):
            if _run_over(slots, run_dir):
                return None
            time.sleep(EVERY)
        said, since = False, time.monotonic()
        while slots["answer"] <= 0:
            if slots["answer"] == CLOSED or _run_over(slots, run_dir) and not slots["answer"]:
                return None
            if not said and time.monotonic() - since > 1.0:
                said = True
                say(f"all {slots['workers']} workers of {run_dir} are running; waiting to take "
                    "the place of one that is lost (Ctrl-C to give up)")
            time.sleep(EVERY)
    except BaseException:
        _withdraw(stop, me)
        raise
    with stop.lock:
        rank = slots["answer"] - 1
        join = f"{rank}:{stop.joined_at[rank]}:{stop.donor[rank]}:{slots['since']}"
        slots["request"] = slots["answer"] = 0
    return join


def _request(stop: Stop, me: int) -> bool:
    with stop.lock:
        if stop.slots["request"] not in (0, me) or stop.slots["closed"]:
            return False
        stop.slots["request"] = me
        return True


def _withdraw(stop: Stop, me: int) -> None:
    """Leave the door before an answer (once taken, the launcher counts on this process:
    leaving then is a loss, as for any worker)."""
    with stop.lock:
        if stop.slots["request"] == me and not stop.slots["answer"]:
            stop.slots["request"] = 0


def _run_over(slots: Slots, run_dir: Path) -> bool:
    """Whether the run closed its door; UserError if its launcher is gone without closing it
    (killed). The door is looked at again after the launcher: a run that closes its door
    and ends between the two looks ended, as far as a joiner is concerned."""
    if slots["closed"]:
        return True
    try:
        _check_running(slots, run_dir)
    except UserError:
        if slots["closed"]:
            return True
        raise
    return False


def _check_running(slots: Slots, run_dir: Path) -> None:
    pid = slots["pid"]
    if pid and not _alive(pid, slots["started"]):  # (0: the launcher has not opened it yet)
        raise UserError(f"the run in {run_dir} is not running any more (its launcher, pid "
                        f"{pid}, is gone)")


def _alive(pid: int, since: int) -> bool:
    """Whether process `pid` runs and is the one that started at `since` (a killed
    launcher's pid may be another process's by now)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's
    now = started(pid)
    return now is None or now == since


def started(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat);
    None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # the name may hold spaces
    except (OSError, IndexError, ValueError):
        return None
