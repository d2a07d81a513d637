"""Who takes part in a run of real processes at each step, once workers are lost and others
join in their place (run.rejoin): the membership that strategies which carry on without the
lost agree on.

Each process standing for a rank is known by the step it joined at (0: the first one). A
connection that ended without a goodbye (Messenger.departures) left at the step after the
last it sent; it belongs to the process that stood for its rank then. A worker that took a
rank's place is back from the step the launcher set (launch.py: ahead of every worker, so
all count it from the same step). So rank r is absent at step s when the process standing
for r at s (the latest return at or before s) has left at or before s.
"""

from __future__ import annotations

from typing import Any

Departures = dict[int, dict[int, tuple[int, float]]]  # rank -> process -> (left at, when)


class Roster:
    """The departures and returns this worker knows of; `seeded` comes with a joiner's state
    from the worker it started from (what happened before this process existed)."""

    def __init__(self) -> None:
        self.returns: dict[int, list[int]] = {}  # rank -> the steps it came back at
        self.seeded: Departures = {}

    def note_returns(self, joined_at: list[int]) -> list[int]:
        """The launcher's latest return step per rank (0: none); each new one is recorded.
        Returns the ranks with a new one."""
        new = []
        for rank, step in enumerate(joined_at):
            known = self.returns.setdefault(rank, [])
            if step and (not known or known[-1] != step):
                known.append(step)
                new.append(rank)
        return new

    def returned_at(self, rank: int, step: int) -> int:
        """The step the process standing for `rank` at `step` joined at (0: the first)."""
        known = self.returns.get(rank)
        if not known:  # asked for every peer at every step: most ranks never came back
            return 0
        return max([s for s in known if s <= step], default=0)

    def departures(self, own: dict[int, list[tuple[int, float]]]) -> Departures:
        """Every departure known, by rank and process: the seeded ones and this process's
        (`own`, by rank); one seen by both, the earlier (a worker that joined later than a
        peer left counts the peer's departure from its own join step)."""
        merged = {rank: dict(left) for rank, left in self.seeded.items()}
        for rank, found in own.items():
            for at, when in found:
                process = merged.setdefault(rank, {})
                since = self.returned_at(rank, at)
                process[since] = min(process.get(since, (at, when)), (at, when))
        return {rank: left for rank, left in merged.items() if left}

    def absent(self, own: dict[int, list[tuple[int, float]]], step: int) -> set[int]:
        """The ranks that take no part in `step`."""
        return {rank for rank, left in self.departures(own).items()
                if left.get(self.returned_at(rank, step), (step + 1,))[0] <= step}

    def history(self, own: dict[int, list[tuple[int, float]]], start: float
                ) -> list[dict[str, Any]]:
        """Each departure, when (seconds after `start`) and the step a new process took the
        rank's place from (None: not back)."""
        return [{"rank": rank, "left_at_step": at, "lost_at": round(when - start, 3),
                 "back_at_step": min([s for s in self.returns.get(rank, []) if s > since],
                                     default=None)}
                for rank, left in sorted(self.departures(own).items())
                for since, (at, when) in sorted(left.items())]

    def state(self, own: dict[int, list[tuple[int, float]]]) -> dict[str, Any]:
        """What a joiner starting from this worker needs to know."""
        return {"departures": self.departures(own), "returns": self.returns}

    def load(self, saved: dict[str, Any]) -> None:
        self.seeded = {int(r): {int(s): tuple(d) for s, d in left.items()}
                       for r, left in saved["departures"].items()}
        self.returns = {int(r): list(s) for r, s in saved["returns"].items()}
