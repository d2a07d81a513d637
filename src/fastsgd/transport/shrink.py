"""Shrinking a gloo group when a worker dies: the survivors break out of the collective the
dead left them in, agree on who is gone and form a group of their own (run.on_failure =
"shrink", worker.py's recovery).

gloo cannot abort a collective. `abort()` and `shutdown()` return at once and leave the call
blocked (torch 2.13, measured: 6 processes, rank 0 killed during a 4 MB all-reduce; its two
ring neighbours fail at once, the three others wait for run.timeout). What does end the call
is its connections: a socket shut down under a blocked read or write fails it with
"Connection reset", as the dead's own did. So a transport notes the sockets each group
opened, and when the messenger learns of a death (the dead's connection closed without a
goodbye) it shuts them down: every survivor's collective fails within moments. Listening
sockets are left alone (gloo's accept loop aborts the process on an error), and a socket is
only shut down while its descriptor still names it (gloo closes its own on errors, and the
number may have been taken by a new socket since).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

from fastsgd.transport.base import GroupBroken, PeerLost

Sockets = dict[int, str]  # descriptor -> "socket:[inode]"
DETECT_WITHIN = 10.0  # s: a collective's error with no death seen by then is not a death
FORM_WITHIN = 30.0  # s: the survivors form their group (milliseconds, unless one dies then)


def _sockets() -> Sockets:
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, too)
        if name.startswith("socket:"):
            found[int(fd)] = name
    return found


def open_group(ranks: list[int] | None, forming: float | None = None,
               timeout: float | None = None) -> tuple[dist.ProcessGroup, Sockets]:
    """A new group of `ranks` (None: every rank, all calling), and the sockets it opened.
    A group of some ranks is formed by them alone (the others may be dead), within
    `forming` seconds; its collectives then wait `timeout` seconds."""
    before = _sockets() if os.path.isdir("/proc/self/fd") else {}
    if ranks is None:  # every rank: its collectives wait `timeout`, as the run's own do
        group = dist.new_group(timeout=timedelta(seconds=timeout) if timeout else None)
    else:
        group = dist.new_group(ranks, timeout=timedelta(seconds=forming or 30.0),
                               use_local_synchronization=True)
        if timeout:
            group.set_timeout(timedelta(seconds=timeout))
    after = _sockets() if before else {}
    return group, {fd: name for fd, name in after.items() if before.get(fd) != name}


def cut(sockets: Sockets) -> None:
    """Shut down the group's connected sockets: its collectives fail on every member."""
    for fd, name in sockets.items():
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != name:
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            sock.getpeername()  # a listener has none: left alone
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()  # the duplicate; gloo's own descriptor stays


def agree_members(store, shrinks: int, alive: list[int]) -> list[int]:
    """The members after shrink number `shrinks`: the first survivor to get here proposes
    those it knows alive, and every survivor takes what the store then holds (compare_set:
    one proposal wins, so all agree). One that knows of a death the winner missed says so
    (GroupBroken) and all go on to the next shrink."""
    key = f"fastsgd/shrink/{shrinks}"
    held = store.compare_set(key, "", ",".join(map(str, alive)))
    return [int(r) for r in held.decode().split(",")]


class Shrinking:
    """A transport's group while it may shrink: the members agreed on, the sockets of the
    group they formed, and how a gloo error becomes GroupBroken."""

    def __init__(self, rank: int, world_size: int, sockets: Sockets, mailbox, store,
                 timeout: float):
        self.rank, self.members = rank, list(range(world_size))
        self.sockets, self.mailbox, self.store = sockets, mailbox, store
        self.timeout = timeout  # run.timeout: the new group's collectives
        self.shrinks = 0
        self._lock = threading.Lock()
        mailbox.on_lost = self._member_lost  # the reader thread: a peer died

    def _member_lost(self, rank: int) -> None:
        """Cut the group if `rank` is in it. The reader thread may tell of a death late,
        after the training thread saw it (mailbox.lost), broke out and formed the survivors'
        group; cutting that group would fail the survivors' next collective with no death
        to explain it (CI: a survivor waited for the other to form a group, which never
        came)."""
        with self._lock:
            if rank in self.members:
                cut(self.sockets)
                self.sockets = {}

    def cut(self) -> None:
        with self._lock:
            cut(self.sockets)
            self.sockets = {}

    def broken(self, error: RuntimeError, within: float = DETECT_WITHIN) -> GroupBroken:
        """The collective failed: if a member is found dead within `within` seconds (its
        message connection closes), the group is broken; else the error was not a death."""
        deadline = time.monotonic() + within
        while not (lost := self.lost()) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not lost:
            raise error
        self.cut()  # every member's next call fails too, and none hangs in the old group
        return GroupBroken(sorted(lost))

    def lost(self) -> set[int]:
        """Members dead, or done: a peer that ended the run (its goodbye came) while this
        one was still in it takes no part in what follows."""
        return (set(self.mailbox.lost_now()) | self.mailbox.done()).intersection(self.members)

    def shrink(self) -> dist.ProcessGroup:
        """Collective among the survivors: agree on who is left, form their group."""
        self.cut()
        self.shrinks += 1
        lost = self.lost()
        members = agree_members(self.store, self.shrinks,
                                [r for r in self.members if r not in lost])
        if self.rank not in members:
            raise RuntimeError(f"worker {self.rank} was counted out of the run by its peers "
                               "(their connections to it broke)")
        if self.lost().intersection(members):
            raise GroupBroken(sorted(self.lost()))  # a death the proposal missed
        try:
            group, sockets = open_group(members, FORM_WITHIN, self.timeout)
        except RuntimeError as e:  # one of them died meanwhile: the next shrink
            raise self.broken(e) from None
        with self._lock:
            self.members, self.sockets = members, sockets
        return group


@contextlib.contextmanager
def guarded(shrinking: Shrinking | None) -> Iterator[None]:
    """A gloo error in a group that may shrink becomes GroupBroken if a member died."""
    try:
        yield
    except RuntimeError as e:
        if shrinking is None or isinstance(e, PeerLost):
            raise
        raise shrinking.broken(e) from None
