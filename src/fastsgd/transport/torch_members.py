"""Who takes part in a run of real processes: the membership queries of TorchTransport.

They answer from what the transport learned (roster.py: departures and returns; the
messenger's lost connections; a shrunk group's members) and change nothing but the roster
and the step that stamps messages. Kept apart from the collectives and messages of
torch_dist.py, which this class is the base of.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastsgd.control import interrupt
from fastsgd.transport.roster import Roster

if TYPE_CHECKING:
    from fastsgd.transport.messages import Messenger
    from fastsgd.transport.shrink import Shrinking
    from fastsgd.transport.survivors import Survivors


class Membership:
    """The membership half of the Transport protocol (transport/base.py), for real
    processes; TorchTransport sets these fields."""

    rank: int
    world_size: int
    roster: Roster
    _step: int  # the step being computed: stamps messages
    _start: float  # time.perf_counter() at the transport's start
    _messenger: Messenger | None
    _survivors: Survivors | None
    _shrinking: Shrinking | None

    def members(self) -> list[int]:
        if self._shrinking is not None:
            return list(self._shrinking.members)
        gone = self.absent(self._step) | set(self.departed())  # lost, or lost now
        return [r for r in range(self.world_size) if r not in gone]

    def departed(self) -> dict[int, tuple[int, float]]:
        """The peers lost now (whose connection ended without a goodbye, and no worker took
        their place), when carrying on or shrinking: the step each left at and when (on
        this worker's clock). The step is the one after the last it sent this worker a
        message from: TCP delivered everything it sent before dying."""
        if self._survivors is None and self._shrinking is None or self._messenger is None:
            return {}
        members = self._shrinking.members if self._shrinking else ()
        lost = self._messenger.mailbox.lost_now()
        return {r: (left[max(left)][0], left[max(left)][1] - self._start)
                for r, left in self.roster.departures(self._messenger.departures()).items()
                if r in lost and r not in members}

    def absent(self, step: int) -> set[int]:
        """The ranks that take no part in `step` (roster.py): lost before it, and not back
        (a worker that joined in a lost one's place is back from its join step on)."""
        if self._survivors is None or self._messenger is None:
            return set(self.departed())
        return self.roster.absent(self._messenger.departures(), step)

    def join_state(self) -> dict:
        """What a worker joining from this one's state needs of the transport: who left and
        came back (roster.py), and how many collectives the members have run (their tags)."""
        assert self._messenger is not None and self._survivors is not None
        return {"roster": self.roster.state(self._messenger.departures()),
                "collectives": self._survivors.calls}

    def load_join_state(self, saved: dict) -> None:
        assert self._survivors is not None
        self.roster.load(saved["roster"])
        self._survivors.calls = int(saved["collectives"])

    def returned_at(self, rank: int, step: int) -> int:
        """The step the process standing for `rank` at `step` joined at (0: the first)."""
        return self.roster.returned_at(rank, step)

    def rejoins(self) -> list[dict[str, float]]:
        """Every departure this worker knows of, with the step a worker took its place from
        (None: not back), for the summary."""
        if self._messenger is None:
            return []
        return self.roster.history(self._messenger.departures(), self._start)

    def starting(self, step: int) -> list[tuple[int, int]]:
        """This worker starts `step`; per rank, the step a new process in a lost one's place
        is back from (0: none) and its donor, as the launcher set them (interrupt.py)."""
        return interrupt.starting(self.rank, step)

    def note_returns(self, step: int, joined_at: list[int]) -> None:
        """At the start of each step: the launcher's word of new workers that join in lost
        ones' places (run.rejoin; `joined_at`: the latest one's step per rank). Messages are
        stamped with `step` from now on."""
        self._step = step
        if self._survivors is not None and self._messenger is not None:
            for rank in self.roster.note_returns(joined_at):
                if rank != self.rank:
                    self._messenger.expect(rank, self.roster.returns[rank][-1])
