"""Who takes part, as one simulated worker sees it: the Transport's membership methods over
the cluster's one roster (faults.Membership), which SimTransport takes from here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastsgd.transport.sim.faults import Crashed

if TYPE_CHECKING:
    from fastsgd.transport.sim.fabric import SimFabric
    from fastsgd.transport.sim.scheduler import Scheduler


class SimMembers:
    """Membership of logical worker `rank` (SimTransport's, see transport/base.py)."""

    rank: int
    fabric: SimFabric
    scheduler: Scheduler
    _step: int  # the step this worker is at
    _seq: int  # how many collectives it has run

    def members(self) -> list[int]:
        fabric = self.fabric  # (a handler sees what happened before its own time)
        if fabric.membership.faults.crashing and fabric.handling_at is None:
            self.scheduler.yield_(self.rank)  # what happened before this worker's clock
        if fabric.replace is None:
            return list(fabric.membership.members)
        gone = self.absent(self._step) | set(self.departed())
        return [r for r in fabric.membership.members if r not in gone]

    def departed(self) -> dict[int, tuple[int, float]]:
        """The workers lost now, and not replaced (as the survivors know)."""
        membership = self.fabric.membership
        return {r: (membership.dead[r], membership.when[r]) for r in membership.known}

    def returned_at(self, rank: int, step: int) -> int:
        """The step the process standing for `rank` at `step` joined at (0: the first)."""
        return self.fabric.membership.roster.returned_at(rank, step)

    def absent(self, step: int) -> set[int]:
        """The workers that take no part in `step`: lost before it, and not back (roster.py)."""
        membership = self.fabric.membership
        return membership.roster.absent(membership.departures, step)

    def starting(self, step: int) -> list[tuple[int, int]]:
        """This worker starts `step`; per rank, the step its latest new process joins at
        (0: none) and its donor (rejoin.py); none without run.rejoin (a list per worker and
        step is n^2 work at 1024 workers)."""
        self.fabric.progress[self.rank] = self._step = step
        if self.fabric.replace is None:
            return []
        membership = self.fabric.membership
        return list(zip(membership.since, membership.donor))

    def note_returns(self, step: int, joined_at: list[int]) -> None:
        """Known already: the simulated cluster keeps one roster (faults.Membership)."""
        self._step = step

    def join_state(self) -> dict:
        """What a new process taking its state from this worker needs of the transport: how
        many collectives have run (the next one's number)."""
        return {"collectives": self._seq}

    def load_join_state(self, saved: dict) -> None:
        self._seq = int(saved["collectives"])

    def leave(self, step: int) -> None:
        """A new process whose donor was lost first leaves, as a lost worker does (from its
        join step); the launcher starts another."""
        self.fabric.crash(self.rank, step)
        raise Crashed()

    def rejoins(self) -> list[dict[str, float]]:
        """Every departure, with the step a new process took the rank's place from."""
        membership = self.fabric.membership
        return membership.roster.history(membership.departures, 0.0)
