"""Evaluating a run at a step: in the simulator, the replica handed to the `Observer` for
free; on real processes, a collective of every worker (observe.py says why)."""

from __future__ import annotations

import copy
import time

import torch

from fastsgd.loop import resume
from fastsgd.loop.context import LoopContext
from fastsgd.loop.replica import replica_tensors
from fastsgd.loop.representative import representative
from fastsgd.strategies.capabilities import hook
from fastsgd.strategies.params import assign


def evaluate(ctx: LoopContext, step: int) -> None:
    """Simulated: hand the replica to the observer, for free; real: a collective, every
    worker joins."""
    ctx.t.await_deferred()  # the model is read
    if ctx.plan.observer is None:
        return evaluate_together(ctx, step)
    ctx.state.evaluated = step
    ctx.plan.observer.hand_in(step, ctx.rank, ctx.model, ctx.clock(), ctx.wall(), ctx.score,
                              held(ctx))
    ctx.t.off_clock()


def held(ctx: LoopContext) -> torch.Tensor | None:
    """The model the strategy holds between its synchronizations (its `held_model`: DiLoCo's
    global model), which the default representative, the average, gives way to: mid-round
    the workers' average is no model such a method has. None: score the representative."""
    if ctx.plan.config["run"]["representative"] != "average":
        return None
    own = hook(ctx.replica.strategy, "held_model")
    return None if own is None else own(ctx.replica.state)


def holding(model: torch.nn.Module, flat: torch.Tensor) -> torch.nn.Module:
    """A copy of `model` holding `flat` (its parameters, then floating-point buffers)."""
    held_copy = copy.deepcopy(model)
    assign(replica_tensors(held_copy), flat)
    return held_copy


def evaluate_together(ctx: LoopContext, step: int) -> None:
    """Real processes: a collective, every worker joins and the leader evaluates; not
    training time: the clock stops once every worker has finished its step."""
    t, state = ctx.t, ctx.state
    t.barrier()
    # who records is settled before the evaluation's collectives: were the leader lost
    # after them, the next one would record the step too (a recovery redoes it if the
    # lost one had not written it)
    leader = ctx.leader
    when, began, wall = ctx.clock(), t.now(), time.perf_counter()
    consensus = ctx.replica.consensus_distance()
    flat = held(ctx)  # the same on every worker: no collective, or all of them
    model = holding(ctx.model, flat) if flat is not None else representative(
        ctx.plan.config["run"]["representative"], ctx.model, t, ctx.score)
    if ctx.rank == leader:
        if ctx.rank != 0 and ctx.log.last is None:  # worker 0 was lost: its log
            ctx.log.take_over()
        resume.kill_if_asked(ctx.rank, step, "evaluation")
        accuracy, loss = ctx.plan.evaluate(model, ctx.plan.dataset, t.device)
        ctx.log.record(step, when, model, accuracy, loss, consensus, ctx.wall())
    t.barrier()  # the others' clocks stop until the leader is done, as the leader's does
    state.evaluated = step  # only now: redone if a worker died meanwhile (recovery.py)
    ctx.log.count += 1
    state.eval_time += t.now() - began
    ctx.log.wall += time.perf_counter() - wall
