"""The per-worker loop: batch -> forward -> backward -> strategy -> optimizer -> metrics.

The same loop runs in a real process (TorchTransport) and as a simulated worker
(SimTransport); all its timings come from `transport.now()`, wall or virtual. Its state is
a `LoopState` (state.py), its handles a `LoopContext` (context.py); the phases beside the
steps are resume.py (start, checkpoints), evaluate.py, recovery.py (a worker lost),
rejoin.py (a worker replaced) and results.py (the end). The practitioner's kit acts in the
step: run.accumulate micro-batches and run.precision (precision.py) in forward_backward,
the learning-rate schedule (schedule.py) and optimizer.clip_norm in update.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from fastsgd.control import interrupt
from fastsgd.errors import UserError
from fastsgd.loop import recovery, rejoin, resume
from fastsgd.loop.context import LoopContext
from fastsgd.loop.evaluate import evaluate
from fastsgd.loop.kit.accumulate import forward_backward
from fastsgd.loop.plan import Plan
from fastsgd.loop.replica import Replica
from fastsgd.loop.results import finish
from fastsgd.records.metrics import PHASES
from fastsgd.transport.base import GroupBroken, Transport


def worker_seed(seed: int, rank: int) -> int:
    """The seed of worker `rank`'s random stream in a run seeded `seed`."""
    return (seed * 1_000_003 + (rank + 1) * 7_919) % 2**63


def train(plan: Plan, transport: Transport) -> dict[str, Any] | None:
    """Train one worker; rank 0 returns the run summary, the others None."""
    torch.manual_seed(plan.config["run"]["seed"])
    model = plan.make_model().to(transport.device)
    optimizer = plan.make_optimizer(model.parameters())
    # the same initial model everywhere; from here each worker draws its own numbers (a
    # codec's stochastic rounding, dropout), independent of its peers' as in QSGD's analysis
    torch.manual_seed(worker_seed(plan.config["run"]["seed"], transport.rank))
    replica = Replica(model, transport, copy.deepcopy(plan.strategy),
                      copy.deepcopy(plan.compressor), total_steps=plan.total_steps(
                          transport.world_size), optimizer=optimizer,
                      joining=getattr(transport, "joining", None) is not None)
    try:
        ctx = LoopContext(plan, replica, optimizer)
        try:
            return run(ctx)
        finally:  # a simulated crash keeps its lines up to its crash, whatever the wall clock
            ctx.metrics.flush()
    finally:
        replica.close()


def run(ctx: LoopContext) -> dict[str, Any] | None:
    """Every step from the first (or the checkpoint's, or the donor's) to the last; the
    run's summary on the leader. A lost worker is recovered from (recovery.py)."""
    k = resume.start(ctx) if getattr(ctx.t, "joining", None) is None else rejoin.join(ctx)
    ctx.progress.follow(ctx.log)  # the bar shows the latest evaluation the log holds
    cfg = ctx.plan.config["run"]
    every, eval_every = cfg["checkpoint_every"], cfg["eval_every"]
    while k < ctx.steps:
        try:
            rejoin.at_step(ctx, k)
            loss = idle(ctx, k) if ctx.state.ended else step(ctx, k)
            if eval_every and (k + 1) % eval_every == 0:
                evaluate(ctx, k + 1)
        except GroupBroken as e:  # a worker died: the survivors go on (recovery.py)
            k = recovery.recover(ctx, e)
            if cfg["on_failure"] == "stop":
                resume.save(ctx, k)  # the survivors' checkpoint; the launcher tells
                ctx.progress.close()
                return None
            continue
        ctx.progress.update(k + 1, loss)
        ctx.events.look(ctx.rank == ctx.leader, ctx.wall(),
                        None if ctx.plan.simulated else ctx.metrics.flush)
        if every and ((k + 1) % every == 0 or k + 1 == ctx.steps):
            resume.save(ctx, k + 1)
        stop = interrupt.stop_after(ctx.rank, k + 1) and k + 1 < ctx.steps
        resume.kill_if_asked(ctx.rank, k + 1)  # after its progress is recorded
        if stop:
            if not (every and (k + 1) % every == 0):
                resume.save(ctx, k + 1)
            ctx.progress.close()
            return None  # Ctrl-C: the launcher says how to resume
        k += 1
    ctx.metrics.flush()
    try:
        while True:
            try:
                return finish(ctx, ctx.wall())
            except GroupBroken as e:
                recovery.recover(ctx, e)
    finally:
        ctx.progress.close()  # after the final evaluation, which its last line shows


def idle(ctx: LoopContext, k: int) -> float:
    """Step `k` of a worker whose strategy ended its training (Context.end): nothing is
    computed or sent; it goes on only to join the evaluations and checkpoints."""
    state = ctx.state
    state.idle += 1
    state.level = 2 * k + 2
    return math.nan


def step(ctx: LoopContext, k: int) -> float:
    """Step `k`: batch, forward, backward, the strategy, the update; its times logged."""
    now, t, state = ctx.clock, ctx.t, ctx.state
    sent, received = t.bytes_sent, t.bytes_received
    ctx.reshard()
    state.level = 2 * k
    t0 = now()
    x, y = ctx.shard.batch(k)
    t1 = now()
    x, y = x.to(t.device, non_blocking=True), y.to(t.device, non_blocking=True)
    t2 = now()
    if not (ctx.own_zero_grad and all(p.grad is None for p in ctx.weights)):
        ctx.optimizer.zero_grad()  # else freed after the last step already (below)
    forward_end: list[float] = []
    value, finite = t.offload(lambda charged: forward_backward(ctx, x, y, charged),
                              lambda: (t.compute("forward", k), forward_end.append(now())))
    t3 = forward_end[0]
    t.compute("backward", k)
    check_finite(ctx, k, value, finite)
    straggle(ctx, k, now() - t2)
    t4 = now()
    resume.kill_if_asked(ctx.rank, k + 1, "gradients")  # fault tests (tests/faults)
    ctx.replica.sync_gradients()
    t5 = now()
    t.offload(lambda charged: update(ctx, k, charged), lambda: stepped(ctx, k))
    t6 = now()
    resume.kill_if_asked(ctx.rank, k + 1, "parameters")
    ctx.replica.sync_parameters()
    state.level = 2 * k + 2
    if ctx.replica.ctx.ended:  # its last trained step: its rate counts up to here
        state.ended, state.dropped, state.penultimate = True, ctx.replica.ctx.dropped, now()
    t7 = now()
    if k == ctx.steps - 2:  # an asynchronous drain's rate stops here (results._rate)
        state.penultimate = t7
    state.sent += t.bytes_sent - sent
    state.received += t.bytes_received - received
    if (k + 1) % ctx.plan.config["run"]["log_every"] == 0 or k + 1 == ctx.steps:
        timings = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, (t5 - t4) + (t7 - t6), t6 - t5)
        log_step(ctx, k, value, t7, timings, (t.bytes_sent - sent, t.bytes_received - received))
    return value


def log_step(ctx: LoopContext, k: int, loss: float, when: float, timings: tuple[float, ...],
             traffic: tuple[int, int]) -> None:
    """Step `k`'s line in metrics.jsonl: its loss, learning rate (and the gradient's norm
    before clipping, where optimizer.clip_norm is set), its phases' times, its bytes."""
    norm = {} if ctx.grad_norm is None else {"grad_norm": float(ctx.grad_norm)}
    ctx.metrics.write({
        "step": k + 1, "rank": ctx.rank, "time": round(when, 9), "loss": loss,
        "lr": float(ctx.optimizer.param_groups[0]["lr"]), **norm,
        **{phase: round(s, 9) for phase, s in zip(PHASES, timings)},  # to the ns
        "bytes_sent": traffic[0], "bytes_received": traffic[1],
        "staleness": ctx.replica.ctx.stats.get("staleness", 0)})


def update(ctx: LoopContext, k: int, charged: Callable[[], None]) -> None:
    """Step `k`'s learning rate (schedule.py), the gradient's clipping (the gradient the
    strategy left: synchronous ones' mean, the others' own), the optimizer step, then
    `charged()` (transport.offload)."""
    ctx.schedule.apply(ctx.optimizer, k)
    if ctx.clip_norm:
        # kept as a tensor: read (a device sync) only on the steps that are logged
        ctx.grad_norm = torch.nn.utils.clip_grad_norm_(ctx.weights, ctx.clip_norm,
                                                       foreach=True)
    ctx.optimizer.step()
    # free the gradients now, not at the next step: 1 MB less per simulated MLP worker
    # while it waits for the others, and the next worker's backward takes the memory
    # while it is still in the cache (what zero_grad does, without its wrappers)
    for p in ctx.weights:
        p.grad = None
    charged()


def stepped(ctx: LoopContext, k: int) -> None:
    ctx.state.level = 2 * k + 1
    ctx.t.compute("update", k)


def check_finite(ctx: LoopContext, k: int, loss: float, finite: bool) -> None:
    """A NaN or inf loss or gradient (`finite` false): this worker's batch is skipped (its
    gradients are zero; it still takes its peers' part, so replicas stay in step) and
    counted. `run.max_bad_steps` in a row stop the run; the checkpoints already written
    stay."""
    state = ctx.state
    if finite:
        state.bad_in_a_row = 0
        return
    state.skipped += 1
    state.bad_in_a_row += 1
    for p in ctx.weights:
        p.grad = None  # the strategies take a missing gradient as zero
    limit = ctx.plan.config["run"]["max_bad_steps"]
    if state.bad_in_a_row > limit:
        what = f"loss {loss}" if not math.isfinite(loss) else "a gradient not finite"
        raise UserError(f"worker {ctx.rank}: {what} at step {k + 1}, {state.bad_in_a_row} "
                        f"steps in a row (run.max_bad_steps = {limit}): training diverged "
                        "or the data is bad (lower optimizer.lr?)")


def straggle(ctx: LoopContext, k: int, seconds: float) -> None:
    """On real processes, a slow worker (compute.slowdown, stragglers) sleeps the extra
    time its forward + backward would have taken; the simulator charges it itself."""
    factor = 1.0 if ctx.plan.simulated else ctx.spread.factor(ctx.rank, k)
    if factor > 1:
        time.sleep((factor - 1) * seconds)
