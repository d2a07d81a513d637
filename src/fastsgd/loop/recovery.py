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
step k again among themselves (the data re-sharded: `LoopContext.reshard`), at 2k+1 they redo its
parameter exchange. An evaluation that was due and lost is done again.
"""

from __future__ import annotations

import io

import torch

from fastsgd.loop.context import LoopContext
from fastsgd.loop.evaluate import evaluate
from fastsgd.transport.base import GroupBroken


def recover(ctx: LoopContext, error: GroupBroken) -> int:
    """After `error`: shrink, agree, catch up; returns the step to go on from. Retried if
    another worker dies meanwhile."""
    ctx.t.await_deferred()  # the model is read
    while True:
        try:
            return _recover(ctx, error)
        except GroupBroken as again:
            error = again


def _recover(ctx: LoopContext, error: GroupBroken) -> int:
    t, state = ctx.t, ctx.state
    members = t.shrink()  # the launcher has said who died, in one line
    mine = torch.tensor([state.level, _recorded(ctx, min(members))], dtype=torch.int64)
    levels, recorded = zip(*(map(int, part) for part in t.all_gather(mine)))
    level = max(levels)
    donor = members[levels.index(level)]
    ctx.replica.restart()  # handles in flight in the broken group are gone
    if min(levels) < level:
        _catch_up(ctx, donor, behind=state.level < level)
    if state.evaluated > min(recorded):  # its evaluation was lost with the evaluator
        ctx.log.count -= 1
    state.level, state.evaluated = level, min(recorded)  # what the leader's log holds
    step = level // 2
    if level % 2:  # stepped, its parameter exchange failed: that again, among the survivors
        ctx.replica.sync_parameters()
        step += 1
        state.level = 2 * step
    if step == ctx.steps - 1 and state.penultimate is None:
        state.penultimate = ctx.clock()
    every = ctx.plan.config["run"]["eval_every"]
    due = step == ctx.steps or every and step % every == 0
    if step and due and state.evaluated < step:
        evaluate(ctx, step)
    return step


def _recorded(ctx: LoopContext, leader: int) -> int:
    """The last step the evaluation log holds, from its writer: the leader (which takes the
    log over if its writer was lost); the others say "any"."""
    if ctx.rank != leader:
        return 2**62
    if ctx.rank != 0 and ctx.log.last is None:
        ctx.log.take_over()
    return ctx.log.last[0] if ctx.log.last else 0


def _catch_up(ctx: LoopContext, donor: int, behind: bool) -> None:
    """The donor's model, optimizer and strategy state to the survivors behind it (one
    broadcast, which every survivor takes part in)."""
    t = ctx.t
    data = torch.zeros(0, dtype=torch.uint8)
    if ctx.rank == donor:
        buffer = io.BytesIO()
        torch.save({"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict(),
                    "replica": ctx.replica.state_dict()}, buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    t.broadcast(size, donor)
    if ctx.rank != donor:
        data = torch.empty(int(size), dtype=torch.uint8)
    t.broadcast(data, donor)
    if behind:
        state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
        ctx.model.load_state_dict(state["model"])
        ctx.optimizer.load_state_dict(state["optimizer"])
        ctx.replica.load_state_dict(state["replica"])
