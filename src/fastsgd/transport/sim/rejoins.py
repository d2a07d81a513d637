"""run.rejoin in the simulator: the launcher's part (rejoin.py is the workers' part, the same
code as on real processes).

Once the survivors know a worker is lost (faults.py: `detect` after its crash), the launcher
sets the step J its new process joins at, AHEAD steps past the furthest worker, as launch.py
does: no worker has started J yet, so all of them count the new one in from J. The donor is
the lowest worker still running that has a state to give (not a new process still waiting
for its own). The new process starts `faults.restart` later and waits for the donor's state,
which crosses the simulated network at the start of J. Nothing is set when J would not come
before the run's last step.
"""

from __future__ import annotations

from collections.abc import Callable

from fastsgd.transport.sim.fabric import SimFabric

AHEAD = 4  # steps past the furthest worker (launch.py's least margin)

Start = Callable[[int, tuple[int, int, int], int], None]  # (rank, joining, when)


def launcher(fabric: SimFabric, steps: int, start: Start) -> Callable[[int, int], None]:
    """`replace(rank, when)`: at virtual time `when`, a new process takes lost `rank`'s place;
    `start(rank, (J, donor, donor's join step), at)` starts it."""

    def replace(rank: int, when: int) -> None:
        membership, progress = fabric.membership, fabric.progress
        step = max(max(progress) + AHEAD, membership.since[rank] + 1)
        donors = [r for r in range(fabric.world_size) if r != rank and membership.alive(r)
                  and (not membership.since[r] or progress[r] > membership.since[r])]
        if step >= steps or not donors:
            return
        joining = (step, donors[0], membership.since[donors[0]])
        membership.back(rank, step, donors[0])
        for action in fabric.on_death:  # the observer counts the new process in from J
            action()
        start(rank, joining, when + (membership.faults.restart_ns or 0))

    return replace
