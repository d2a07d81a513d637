"""A synchronous run goes on without its dead (run.on_failure = "shrink", real processes).

A worker's death fails every survivor's collective at once (GroupBroken, transport/shrink.py);
each survivor then comes here. They agree on who is gone and form a group of their own
(`transport.shrink()`), then on where training stands. Each survivor says how far it got,
as a level: 2k while in step k up to its optimizer step, 2k+1 once it has stepped (its
parameter exchange to come), 2k+2 when step k is done. A collective can complete on some
members and fail on others (the dead may die after sending a part of it), so levels may
differ by one. Those behind take the state of the first survivor at the highest level
(model, optimizer, strategy), as torchft recovers a replica from a live peer; none of them
is behind by more, and the others keep theirs. Then all go on from that level: at 2k they do
step k again among themselves (the data re-sharded: `_Loop.reshard`), at 2k+1 they redo its
parameter exchange. An evaluation that was due and lost is done again.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import torch

from fastsgd.transport.base import GroupBroken

if TYPE_CHECKING:
    from fastsgd.loop.worker import _Loop as Loop


def recover(loop: Loop, error: GroupBroken) -> int:
    """After `error`: shrink, agree, catch up; returns the step to go on from. Retried if
    another worker dies meanwhile."""
    loop.t.await_deferred()  # the model is read
    while True:
        try:
            return _recover(loop, error)
        except GroupBroken as again:
            error = again


def _recover(loop: Loop, error: GroupBroken) -> int:
    t = loop.t
    members = t.shrink()  # the launcher has said who died, in one line
    mine = torch.tensor([loop.level, _recorded(loop, min(members))], dtype=torch.int64)
    levels, recorded = zip(*(map(int, part) for part in t.all_gather(mine)))
    level = max(levels)
    donor = members[levels.index(level)]
    loop.replica.restart()  # handles in flight in the broken group are gone
    if min(levels) < level:
        _catch_up(loop, donor, behind=loop.level < level)
    if loop.evaluated > min(recorded):  # its evaluation was lost with the evaluator
        loop.log.count -= 1
    loop.level, loop.evaluated = level, min(recorded)  # what the leader's log holds
    step = level // 2
    if level % 2:  # stepped, its parameter exchange failed: that again, among the survivors
        loop.replica.sync_parameters()
        step += 1
        loop.level = 2 * step
    if step == loop.steps - 1 and loop.penultimate is None:
        loop.penultimate = loop.clock()
    due = step == loop.steps or loop.eval_every and step % loop.eval_every == 0
    if step and due and loop.evaluated < step:
        loop.evaluate(step)
    return step


def _recorded(loop: Loop, leader: int) -> int:
    """The last step the evaluation log holds, from its writer: the leader (which takes the
    log over if its writer was lost); the others say "any"."""
    if loop.rank != leader:
        return 2**62
    if loop.rank != 0 and loop.log.last is None:
        loop.log.take_over()
    return loop.log.last[0] if loop.log.last else 0


def _catch_up(loop: Loop, donor: int, behind: bool) -> None:
    """The donor's model, optimizer and strategy state to the survivors behind it (one
    broadcast, which every survivor takes part in)."""
    t = loop.t
    data = torch.zeros(0, dtype=torch.uint8)
    if loop.rank == donor:
        buffer = io.BytesIO()
        torch.save({"model": loop.model.state_dict(), "optimizer": loop.optimizer.state_dict(),
                    "replica": loop.replica.state_dict()}, buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    t.broadcast(size, donor)
    if loop.rank != donor:
        data = torch.empty(int(size), dtype=torch.uint8)
    t.broadcast(data, donor)
    if behind:
        state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
        loop.model.load_state_dict(state["model"])
        loop.optimizer.load_state_dict(state["optimizer"])
        loop.replica.load_state_dict(state["replica"])
