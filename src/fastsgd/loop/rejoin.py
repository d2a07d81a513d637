"""A new worker process takes a lost one's place in a running run (run.rejoin), starting from
a live worker's state: all of it, over the network, not from disk and not from scratch.

The launcher (launch.py) starts the new process with FASTSGD_JOIN=STEP:DONOR:SINCE once it
has set STEP ahead of every worker (interrupt.Stop.rejoin), so that every worker counts the
new one in from the same step (transport/roster.py); the simulator's launcher does the same
at virtual time (transport/sim/rejoins.py), and the transport says which (`joining`). The
new process connects to every peer still there (transport/connections.py) and waits. The
donor, the lowest worker still running, sends it at the start of STEP what a checkpoint
holds: model, optimizer (learning rate and moments), the strategy's and codec's state, step
counters, the run's clock and the eval log's state; the strategy splits what must not be
counted twice (sgp: its push-sum weight, `donate`). The joiner loads it and trains from STEP
on like every other worker. Its random streams start from (seed, rank, STEP), not the
donor's: two workers drawing the same numbers would not be independent.
"""

from __future__ import annotations

import io
import os
import random
import signal
import time

import numpy as np
import torch

from fastsgd.control import interrupt
from fastsgd.loop import resume
from fastsgd.loop.context import LoopContext
from fastsgd.loop.state import SHARED
from fastsgd.records import checkpoint
from fastsgd.strategies import hook
from fastsgd.transport import frames
from fastsgd.transport.base import PeerLost

JOIN_TAG = frames.JOIN_TAG  # the donor's state for a joiner


def at_step(ctx: LoopContext, step: int) -> None:
    """At the start of each step: learn of workers that join (transport/roster.py), and
    give one that joins at this step from this worker's state its state."""
    starting = getattr(ctx.t, "starting", None)
    if starting is None:
        return
    joins = starting(step)  # per rank: (the step it joins at, donor)
    ctx.t.note_returns(step, [at for at, _ in joins])
    donate(ctx, step, joins)


def donate(ctx: LoopContext, step: int, joins: list[tuple[int, int]]) -> None:
    """Send the state to every worker that joins at `step` from this one's (once each: a
    rank may be lost and replaced again)."""
    for joiner, (at, donor) in enumerate(joins):
        if not at or at != step or donor != ctx.rank or (joiner, at) in ctx.donated:
            continue
        ctx.donated.add((joiner, at))
        ctx.t.await_deferred()  # the model is read
        if (os.environ.get("FASTSGD_TEST_KILL_DONOR") == str(ctx.rank)
                and ctx.t.joining is None):  # fault tests: a donor that dies first
            os.kill(os.getpid(), signal.SIGKILL)
        replica = ctx.replica.state_dict()
        split = hook(ctx.replica.strategy, "donate")  # else the state as it is
        replica["strategy"] = split(ctx.replica.state) if split else ctx.replica.state
        state = {"format": checkpoint.FORMAT, "step": step, "model": ctx.model.state_dict(),
                 "optimizer": ctx.optimizer.state_dict(), "replica": replica,
                 "loop": resume.loop_state(ctx, ctx.t.now()),
                 "transport": ctx.t.join_state()}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        ctx.t.post(torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8), joiner,
                    JOIN_TAG)


def _take_state(ctx: LoopContext, step: int, donor: int, donor_since: int) -> torch.Tensor:
    """The donor's state. If the donor's process died first (PeerLost, or the launcher has
    started another in its rank since, whose hello this process may never get), leave as a
    lost worker does, without a goodbye: the others count this process out from its join
    step, and the launcher starts another from a live worker's state."""
    deadline = time.monotonic() + ctx.plan.config["run"]["timeout"]
    while True:
        try:
            return ctx.t.take_from(JOIN_TAG, donor, step, timeout=0.5)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
            if interrupt.joined_at()[donor] == donor_since:
                continue  # the same donor, still on its way to `step`
        except PeerLost:
            pass
        if ctx.plan.simulated:
            ctx.t.leave(step)
        os._exit(interrupt.DONOR_LOST)


def join(ctx: LoopContext) -> int:
    """In a new worker: wait for the donor's state, take it on, and return the step to train
    from."""
    step, donor, donor_since = ctx.t.joining or (0, 0, 0)
    buffer = _take_state(ctx, step, donor, donor_since)
    saved = checkpoint.load(buffer.cpu().numpy().tobytes())
    ctx.model.load_state_dict(saved["model"])
    ctx.optimizer.load_state_dict(saved["optimizer"])
    ctx.replica.load_state_dict(saved["replica"])
    joined = hook(ctx.replica.strategy, "joined")
    if joined is not None:
        joined(step, ctx.replica.params)
    ctx.t.load_join_state(saved["transport"])
    was = saved["loop"]
    ctx.state.load_state_dict(was, only=SHARED)
    ctx.log.load(was["log"])
    ctx.start_clocks(was["clock"])
    seed = (ctx.plan.config["run"]["seed"] * 1_000_003 + ctx.rank * 10_007 + step) % 2**31
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return step
