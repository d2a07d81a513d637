"""Membership under run.rejoin (transport/roster.py): each process that stands for a rank is
counted in from the step it joined at and out from the step it left at, whatever order
the news comes in."""

import pytest
import torch

from fastsgd.transport.base import PeerLost
from fastsgd.transport.mailbox import Mailbox
from fastsgd.transport.roster import Roster


def test_a_lost_worker_is_out_until_its_replacement_joins():
    roster = Roster()
    own = {2: [(40, 1.0)]}
    assert roster.absent(own, 39) == set() and roster.absent(own, 40) == {2}
    roster.note_returns([0, 0, 60, 0])
    assert roster.absent(own, 59) == {2} and roster.absent(own, 60) == set()
    roster.note_returns([0, 0, 60, 0])  # read again every step: recorded once
    assert roster.returns[2] == [60]
    # the replacement is lost before it sent anything: it left at the step it joined at
    own[2].append((60, 2.0))
    assert roster.absent(own, 59) == {2} and roster.absent(own, 61) == {2}
    roster.note_returns([0, 0, 90, 0])
    assert roster.absent(own, 89) == {2} and roster.absent(own, 90) == set()
    assert [(h["left_at_step"], h["back_at_step"]) for h in roster.history(own, 0.0)] == [
        (40, 60), (60, 90)]


def test_a_return_read_too_late_to_see_changes_nothing_after_it():
    # the launcher set 60, then 90 before this worker read 60: it only knows 90
    roster = Roster()
    own = {2: [(40, 1.0), (60, 2.0)]}
    roster.note_returns([0, 0, 90, 0])
    assert roster.absent(own, 50) == {2} and roster.absent(own, 70) == {2}
    assert roster.absent(own, 90) == set() and roster.absent(own, 500) == set()


def test_a_joiner_learns_what_happened_before_it_existed_from_its_donor():
    donor = Roster()
    donor.note_returns([0, 0, 60, 0])
    own = {2: [(40, 1.0)], 3: [(10, 0.5)]}
    joiner = Roster()
    joiner.load(donor.state(own))
    assert joiner.absent({}, 50) == {2, 3} and joiner.absent({}, 95) == {3}
    # the joiner (at 70) saw worker 3's process end from its own join step: the donor's
    # earlier step stands; worker 2's new process is lost at 80
    assert joiner.absent({3: [(70, 3.0)], 2: [(80, 4.0)]}, 75) == {3}
    assert joiner.departures({3: [(70, 3.0)]})[3] == {0: (10, 0.5)}
    assert joiner.absent({2: [(80, 4.0)]}, 80) == {2, 3}


def test_a_wait_for_a_step_before_a_rank_came_back_fails_once_its_old_process_ended():
    mailbox = Mailbox()
    mailbox.put(-3, 1, torch.ones(1), step=3)
    assert mailbox.take_step(-3, 1, 3, timeout=1.0)[0] == 3
    mailbox.welcome(1)  # a new process joins as worker 1 at step 10
    mailbox.cut(1, 10)
    with pytest.raises(PeerLost) as lost:
        mailbox.take_step(-3, 1, 4, timeout=1.0)
    assert lost.value.peers == [1]
    mailbox.put(-3, 1, torch.ones(1), step=10)  # from the new process: taken
    assert mailbox.take_step(-3, 1, 10, timeout=1.0)[0] == 10
