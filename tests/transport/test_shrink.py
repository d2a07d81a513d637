"""A gloo group that shrinks (transport/shrink.py): six processes, one killed during a 4 MB
all-reduce. gloo alone fails only the dead's ring neighbours and leaves the others blocked
until run.timeout; here every survivor's call fails within seconds, and the survivors form a
group of their own."""

import os
import signal
import socket
import time

import pytest
import torch

from fastsgd.control import interrupt
from fastsgd.launch.local import launch
from fastsgd.transport.base import GroupBroken
from fastsgd.transport.shrink import Shrinking
from fastsgd.transport.torch_dist import TorchTransport

TIMEOUT = 120.0  # run.timeout: what a survivor would wait without the cut


def _until_one_dies(out):
    def body():
        t = TorchTransport("gloo", timeout=TIMEOUT)
        t.shrinkable()
        interrupt.set_ready(t.rank)  # as `fastsgd run`'s workers do: its death is survived
        tensor = torch.ones(2**20)
        for i in range(10_000):
            if t.rank == 3 and i == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            began = time.perf_counter()
            try:
                t.all_reduce(tensor.fill_(1.0))
            except GroupBroken as e:
                waited, lost = time.perf_counter() - began, e.lost
                break
        members = t.shrink()
        t.all_reduce(tensor.fill_(1.0))
        torch.save({"waited": waited, "lost": lost, "members": members,
                    "sum": float(tensor[0]), "departed": sorted(t.departed())},
                   f"{out}/{t.rank}.pt")
        t.close()
    return body


@pytest.mark.multiproc
def test_every_survivor_breaks_out_at_once_and_the_group_shrinks(tmp_path):
    launch(_until_one_dies(tmp_path), 6, expendable=0)
    survivors = [0, 1, 2, 4, 5]
    for rank in survivors:
        got = torch.load(tmp_path / f"{rank}.pt")
        assert got["lost"] == [3] and got["members"] == survivors and got["departed"] == [3]
        assert got["waited"] < 10.0  # seconds, where gloo alone waits TIMEOUT
        assert got["sum"] == 5.0  # the survivors' group
    assert not (tmp_path / "3.pt").exists()


class _Mailbox:
    on_lost = None

    def lose(self, rank):
        self.on_lost(rank)


def test_word_of_a_death_that_comes_after_the_survivors_formed_their_group_cuts_nothing():
    """The reader thread may tell of a death once the survivors' group is formed without the
    dead: that group stays connected; a death in it cuts it."""
    mine, theirs = socket.socketpair()
    mailbox = _Mailbox()
    shrinking = Shrinking(1, 3, {}, mailbox, store=None, timeout=TIMEOUT)
    shrinking.members, shrinking.sockets = [1, 2], {mine.fileno(): _name(mine)}
    mailbox.lose(0)  # the dead, already out of the group
    mine.sendall(b"x")
    assert theirs.recv(1) == b"x"
    mailbox.lose(2)  # a member
    assert shrinking.sockets == {} and theirs.recv(1) == b""  # shut down: the peer sees EOF
    mine.close()
    theirs.close()


def _name(sock):
    return os.readlink(f"/proc/self/fd/{sock.fileno()}")
