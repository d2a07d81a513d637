"""The messenger's mailbox: a wait for a peer whose process is gone ends, even once another
process has taken the peer's rank (run.rejoin), when that one joined after the wait's step."""

import pytest
import torch

from fastsgd.transport.base import PeerLost
from fastsgd.transport.mailbox import Mailbox


def _replaced(at: int) -> Mailbox:
    """Rank 2 was lost, and a new process in its place joins at step `at` (its hello came:
    rank 2 is no longer lost)."""
    box = Mailbox()
    box.lose(2)
    box.welcome(2)
    box.cut(2, at)
    return box


def test_a_wait_at_a_step_before_the_replacement_joined_ends_with_peer_lost():
    box = _replaced(at=103)
    with pytest.raises(PeerLost):
        box.take_one(-1001, timeout=5, src=2, at=100)  # a survivors' collective at step 100
    with pytest.raises(PeerLost):
        box.take_step(7, src=2, step=102, timeout=5)


def test_a_wait_from_the_step_the_replacement_joined_at_is_for_it():
    box = _replaced(at=103)
    with pytest.raises(TimeoutError):
        box.take_one(-1001, timeout=0.05, src=2, at=103)
    box.put(-1001, 2, torch.ones(1), step=103)
    assert box.take_one(-1001, timeout=5, src=2, at=103)[0] == 2


def test_what_the_gone_process_sent_before_it_went_is_still_taken():
    box = Mailbox()
    box.put(-1001, 2, torch.ones(1), step=99)
    box.lose(2)
    box.welcome(2)
    box.cut(2, 103)
    assert box.take_one(-1001, timeout=5, src=2, at=100)[0] == 2
