"""What a worker's loop carries from step to step (`LoopState`), beside the model, the
optimizer and the strategy's state, and what its checkpoint holds of it.

The loop's runtime handles (the transport, the replica, open files, the progress bar) are
not state: they live in `loop/context.py` and are made again by every process. A checkpoint
and a joining worker take `state_dict()`; `load_state_dict` puts back exactly what it gave.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# what a worker that joins a running run takes of its donor's state (rejoin.py): the run's
# clocks and how far its evaluations got; its byte and skip counters are its own, from zero
SHARED = ("eval_time", "paused", "evaluated", "wall")


@dataclass
class LoopState:
    """One worker's loop, between two steps.

    `start` and the clock offsets put the run's clock together: seconds of training so far
    are `transport.now() - start - eval_time - paused` (evaluation and checkpoints are not
    training time); `wall` is the wall seconds of training before this process started
    (those of earlier attempts, resumed from)."""

    level: int = 0  # how far this worker got: 2k in step k, 2k+1 once it stepped (recovery)
    members: list[int] = field(default_factory=list)  # those the data is split among
    weight: float = 1.0  # of this worker's loss: its share of the global batch (reshard)
    sent: int = 0  # bytes this worker sent and received in its steps
    received: int = 0
    skipped: int = 0  # steps whose loss or gradient was not finite
    ended: bool = False  # the strategy ended this worker's training (Context.end)
    idle: int = 0  # steps not trained since
    dropped: int = 0  # steps trained whose work the strategy dropped
    bad_in_a_row: int = 0
    evaluated: int = 0  # the last step evaluated
    eval_time: float = 0.0  # evaluation time on the run's clock (real processes)
    paused: float = 0.0  # checkpoint time on the run's clock
    start: float = 0.0  # the transport's clock when training started, shifted on resume
    wall: float = 0.0  # wall seconds of training in earlier attempts
    # the run's clock after the second-to-last step (where a strategy with an asynchronous
    # drain's rate stops: results._rate), or after the last step trained if the strategy
    # ended this worker's training
    penultimate: float | None = None
    lost_before: list = field(default_factory=list)  # summary's lost_workers before a resume

    def state_dict(self, clock: float, wall: float) -> dict[str, Any]:
        """Every field, with the run's `clock` and `wall` seconds read now. The keys of
        checkpoints before this type existed are kept: `skipped` holds both skip counters."""
        saved = {f.name: getattr(self, f.name) for f in fields(self)}
        saved["members"] = list(self.members)
        saved["lost_before"] = list(self.lost_before)
        saved["skipped"] = [self.skipped, saved.pop("bad_in_a_row")]
        saved.update(clock=clock, wall=wall)
        return saved

    def load_state_dict(self, saved: dict[str, Any], only: tuple[str, ...] = ()) -> None:
        """Take back what `state_dict` gave (`only`: those keys); fields an older checkpoint
        lacks keep their values."""
        for f in fields(self):
            if f.name == "bad_in_a_row" or (only and f.name not in only):
                continue
            if f.name in saved:
                setattr(self, f.name, saved[f.name])
        if "skipped" in saved and (not only or "skipped" in only):
            self.skipped, self.bad_in_a_row = saved["skipped"]
        self.members = list(self.members)
