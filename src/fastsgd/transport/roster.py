"""Who takes part in a run of real processes at each step, once workers are lost and others
join in their place (run.rejoin): the membership that strategies which carry on without the
lost agree on.

A rank's connection that ended without a goodbye (Messenger.departures) left at the step
after the last it sent; a worker that took its place is back from the step the launcher set
(launch.py: ahead of every worker, so all count it from the same step). So rank r is absent
at step s when, for some i, its i-th departure is at or before s and its i-th return after
s (or has not come).
"""

from __future__ import annotations

import math
from typing import Any


class Roster:
    """The departures and returns this worker knows of; `seeded` comes with a joiner's state
    from the worker it started from (what happened before this process existed)."""

    def __init__(self) -> None:
        self.returns: dict[int, list[int]] = {}  # rank -> the steps it came back at
        self.seeded: dict[int, list[tuple[int, float]]] = {}  # rank -> departures before

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

    def departures(self, own: dict[int, list[tuple[int, float]]]
                   ) -> dict[int, list[tuple[int, float]]]:
        """Every departure known, by rank: the seeded ones, then this process's (`own`)."""
        merged = {r: list(d) for r, d in self.seeded.items()}
        for rank, found in own.items():  # one death, seen by the donor and by this one
            seen = {at for at, _ in merged.setdefault(rank, [])}
            merged[rank].extend(d for d in found if d[0] not in seen)
        return {r: sorted(d) for r, d in merged.items() if d}

    def absent(self, own: dict[int, list[tuple[int, float]]], step: int) -> set[int]:
        """The ranks that take no part in `step`."""
        out = set()
        for rank, left in self.departures(own).items():
            back = self.returns.get(rank, [])
            for i, (at, _) in enumerate(left):
                until = back[i] if i < len(back) else math.inf
                if 0 < i <= len(back):  # a joiner lost before it sent anything left when it joined
                    at = max(at, back[i - 1])
                if at <= step < until:
                    out.add(rank)
        return out

    def returned_at(self, rank: int, step: int) -> int:
        """The step the process standing for `rank` at `step` joined at (0: the first)."""
        return max([s for s in self.returns.get(rank, []) if s <= step], default=0)

    def history(self, own: dict[int, list[tuple[int, float]]], start: float
                ) -> list[dict[str, Any]]:
        """Each departure, when (seconds after `start`) and the step a new process took the
        rank's place from (None: not back)."""
        out = []
        for rank, left in self.departures(own).items():
            back = self.returns.get(rank, [])
            out += [{"rank": rank, "left_at_step": at, "lost_at": round(when - start, 3),
                     "back_at_step": back[i] if i < len(back) else None}
                    for i, (at, when) in enumerate(left)]
        return out

    def state(self, own: dict[int, list[tuple[int, float]]]) -> dict[str, Any]:
        """What a joiner starting from this worker needs to know."""
        return {"departures": self.departures(own), "returns": self.returns}

    def load(self, saved: dict[str, Any]) -> None:
        self.seeded = {int(r): [tuple(d) for d in ds] for r, ds in saved["departures"].items()}
        self.returns = {int(r): list(s) for r, s in saved["returns"].items()}
