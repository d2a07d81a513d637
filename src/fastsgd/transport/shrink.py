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

import os
import socket
import threading
import time

import torch
import torch.distributed as dist

from fastsgd.transport.base import GroupBroken
from fastsgd.transport.survivors import Survivors

Sockets = dict[int, str]  # descriptor -> "socket:[inode]"
DETECT_WITHIN = 10.0  # s: a collective's error with no death seen by then is not a death
SHRINK_TAG = -500_000  # the survivors' agreement of shrink k uses tags below SHRINK_TAG - 100k


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


def open_group(ranks: list[int] | None) -> tuple[dist.ProcessGroup, Sockets]:
    """A new group of `ranks` (None: every rank, all calling), and the sockets it opened.
    A group of some ranks is formed by them alone (the others may be dead)."""
    before = _sockets() if os.path.isdir("/proc/self/fd") else {}
    if ranks is None:
        group = dist.new_group()
    else:
        group = dist.new_group(ranks, use_local_synchronization=True)
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


def agree_gone(transport, lost: set[int], shrinks: int) -> set[int]:
    """Collective among the survivors, over messages: everyone's view of who is gone, joined.
    A survivor that had not yet seen a death learns of it while it waits for the dead's view
    (PeerLost), so every survivor ends up with the same views and the same union."""
    view = torch.zeros(transport.world_size, dtype=torch.uint8)
    view[sorted(lost)] = 1
    agreement = Survivors(transport, first_tag=SHRINK_TAG - 100 * shrinks)
    views = agreement.gather(view)  # a member lost meanwhile is left out
    gone = set(lost)
    for part in views.values():
        gone.update(int(r) for r in part.nonzero().flatten())
    return gone | (set(range(transport.world_size)) - set(views))


class Shrinking:
    """A transport's group while it may shrink: the members agreed on, the sockets of the
    group they formed, and how a gloo error becomes GroupBroken."""

    def __init__(self, world_size: int, sockets: Sockets, mailbox):
        self.members = list(range(world_size))
        self.sockets = sockets
        self.mailbox = mailbox
        self.shrinks = 0
        self._lock = threading.Lock()
        mailbox.on_lost = lambda _rank: self.cut()  # the reader thread: a peer died

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
        return set(self.mailbox.lost_now()).intersection(self.members)

    def shrink(self, transport) -> dist.ProcessGroup:
        """Collective among the survivors: agree on who is gone, form their group."""
        self.cut()
        self.shrinks += 1
        gone = agree_gone(transport, self.lost(), self.shrinks)
        survivors = [r for r in self.members if r not in gone]
        group, sockets = open_group(survivors)
        with self._lock:
            self.members, self.sockets = survivors, sockets
        return group
