"""What one worker's loop works with: its runtime handles (the transport, the replica, the
optimizer, its files) and its declared state (`LoopState`). Every phase of the loop
(resume.py, recovery.py, rejoin.py, evaluate.py, results.py) takes a `LoopContext`; only the
state is saved."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch

from fastsgd.control import interrupt
from fastsgd.loop.checked_step import StepChecks
from fastsgd.loop.kit.precision import Precision
from fastsgd.loop.kit.schedule import Schedule
from fastsgd.loop.observe import EvalLog, target_of
from fastsgd.loop.plan import Plan
from fastsgd.loop.replica import Replica
from fastsgd.loop.state import LoopState
from fastsgd.records.metrics import JsonLines
from fastsgd.records.progress import Progress
from fastsgd.records.tensorboard import LiveEvents
from fastsgd.transport.sim.compute import heterogeneity


class LoopContext:
    """A worker's handles and state; `clock()` and `wall()` read the run's time."""

    def __init__(self, plan: Plan, replica: Replica, optimizer: torch.optim.Optimizer):
        self.plan, self.replica, self.optimizer = plan, replica, optimizer
        self.model = replica.model
        self.weights = list(self.model.parameters())  # once: a module walk costs 40 us a step
        self.t = replica.transport
        # torch's own zero_grad only frees gradients (a user's optimizer may do more in its)
        self.own_zero_grad = type(optimizer).zero_grad is torch.optim.Optimizer.zero_grad
        self.rank, self.world = self.t.rank, self.t.world_size
        self.state = LoopState(members=list(range(self.world)))
        self.checked_step = StepChecks(plan.step, self.weights, f"worker {self.rank}: ")
        self.shard = plan.shard(self.rank, self.world)
        self.steps = plan.total_steps(self.world)
        # the practitioner's kit (worker.py): refused here, in one line, before any step
        self.schedule = Schedule(plan.config["optimizer"], self.steps)
        self.schedule.start(optimizer)  # after a strategy's adjustment of the rates
        self.precision = Precision(plan.config["run"]["precision"], self.t.device)
        self.accumulate = plan.config["run"]["accumulate"]
        self.clip_norm = plan.config["optimizer"].get("clip_norm", 0.0)
        self.grad_norm: torch.Tensor | None = None  # the last clipped step's, before clipping
        run = plan.config["run"]
        # in simulation, flushed by lines only: the file's order must not depend on wall time
        self.metrics = JsonLines(plan.run_dir / "metrics.jsonl",
                                 within=math.inf if plan.simulated else 1.0)
        self.log = plan.observer.log if plan.observer else EvalLog(
            plan.run_dir / "eval.jsonl", target_of(run, plan.dataset.kind), plan.dataset.kind)
        self.spread = heterogeneity(plan.config["compute"], run["seed"])
        replica.ctx.score = lambda: plan.score(self.model, self.t.device, self.rank)
        self.progress = Progress(self.steps, enabled=plan.progress and self.rank == 0)
        self.events = LiveEvents(plan.run_dir, run["tensorboard"])
        self.donated: set[tuple[int, int]] = set()  # (joiner, step): rejoin.donate
        self.wall_start = 0.0  # time.perf_counter() when this process began training

    def clock(self) -> float:
        """Seconds of training so far (wall, or virtual in the simulator), evaluation and
        checkpoints excluded."""
        s = self.state
        return self.t.now() - s.start - s.eval_time - s.paused

    def wall(self) -> float:
        """Wall seconds of training so far, over every resume."""
        return self.state.wall + time.perf_counter() - self.wall_start

    def start_clocks(self, clock: float = 0.0) -> None:
        """Training starts now, `clock` seconds into the run (a resume, a joiner)."""
        s = self.state
        s.start = self.t.now() - clock - s.eval_time - s.paused
        self.wall_start = time.perf_counter()

    def reshard(self) -> None:
        """Workers were lost: the survivors split each global batch among themselves from
        now on, so no part of the data goes unseen (and allreduce stays large-batch SGD)."""
        members = self.t.members()
        if members != self.state.members:
            self.split_among(members)

    def split_among(self, members: list[int]) -> None:
        self.state.members = members
        self.shard = self.plan.shard(self.rank, self.world).among(members.index(self.rank),
                                                                   len(members))
        # parts may differ by a sample: each gradient weighs as many samples as it has,
        # so that the survivors' mean is the global batch's mean gradient
        start, end = self.shard.part
        self.state.weight = (end - start) * len(members) / (self.shard.batch_size * self.world)

    @property
    def leader(self) -> int:
        """The worker that evaluates and writes the results: 0, or once it is lost (a
        strategy that carries on without it) the lowest still in the run."""
        return min(self.t.members())

    @property
    def leads_node(self) -> bool:
        """Writes the run directory's shared files on its node (each node has its own; the
        leader's is written by the leader, worker 0 or, once it is lost, the lowest left)."""
        local_first = not self.plan.simulated and os.environ.get("LOCAL_RANK") == "0"
        return self.rank == self.leader or local_first

    def score(self, model: torch.nn.Module) -> float:
        """The loss every worker scores a model by (Plan.score)."""
        return self.plan.score(model, self.t.device)

    def lost_workers(self) -> list[dict[str, Any]]:
        """Who left, at which step, when: those lost before the run was resumed (from its
        checkpoint), then this process's. On real processes the launcher's shared memory
        knows how far a dead worker got; rank 0's own view (its last message) may be older."""
        lost = list(self.state.lost_before)
        for r, (step, when) in sorted(self.t.departed().items()):
            done = None if self.plan.simulated else interrupt.steps_done(r)
            lost.append({"worker": r, "step": step if done is None else done,
                         "time": round(when - self.state.start, 9)})
        return lost
