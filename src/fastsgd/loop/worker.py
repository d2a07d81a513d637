"""The per-worker loop: batch -> forward -> backward -> strategy -> optimizer -> metrics.

The same loop runs in a real process (TorchTransport) and as a simulated worker
(SimTransport); all its timings come from `transport.now()`, wall or virtual.
"""

from __future__ import annotations

import copy
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch

from fastsgd.config.schema import to_toml
from fastsgd.control import interrupt
from fastsgd.errors import UserError
from fastsgd.loop import recovery, rejoin, results, resume
from fastsgd.loop.checked_step import StepChecks
from fastsgd.loop.observe import EvalLog, evaluate_together
from fastsgd.loop.plan import Plan
from fastsgd.loop.replica import Replica
from fastsgd.records import checkpoint
from fastsgd.records.metrics import PHASES, JsonLines, write_json
from fastsgd.records.progress import Progress
from fastsgd.records.rundir import environment, host_names
from fastsgd.records.tensorboard import LiveEvents
from fastsgd.strategies.params import all_finite
from fastsgd.transport.base import GroupBroken, Transport
from fastsgd.transport.sim.compute import heterogeneity


def train(plan: Plan, transport: Transport) -> dict[str, Any] | None:
    """Train one worker; rank 0 returns the run summary, the others None."""
    torch.manual_seed(plan.config["run"]["seed"])
    model = plan.make_model().to(transport.device)
    optimizer = plan.make_optimizer(model.parameters())
    replica = Replica(model, transport, copy.deepcopy(plan.strategy),
                      copy.deepcopy(plan.compressor), total_steps=plan.total_steps(
                          transport.world_size), optimizer=optimizer,
                      joining=getattr(transport, "joining", None) is not None)
    try:
        loop = _Loop(plan, replica, optimizer)
        try:
            return loop.run()
        finally:  # a simulated crash keeps its lines up to its crash, whatever the wall clock
            loop.metrics.flush()
    finally:
        replica.close()


class _Loop:
    def __init__(self, plan: Plan, replica: Replica, optimizer: torch.optim.Optimizer):
        self.plan, self.replica, self.optimizer = plan, replica, optimizer
        self.model = replica.model
        self.weights = list(self.model.parameters())  # once: a module walk costs 40 us a step
        # torch's own zero_grad only frees gradients (a user's optimizer may do more in its)
        self.own_zero_grad = type(optimizer).zero_grad is torch.optim.Optimizer.zero_grad
        self.t = replica.transport
        self.rank, self.world = self.t.rank, self.t.world_size
        self.checked_step = StepChecks(plan.step, self.weights, f"worker {self.rank}: ")
        self.shard = plan.shard(self.rank, self.world)
        self.members = list(range(self.world))  # those the shard is split among (reshard)
        self.weight = 1.0  # of this worker's loss: its share of the global batch (reshard)
        self.steps = plan.total_steps(self.world)
        run = plan.config["run"]
        self.eval_every, self.log_every = run["eval_every"], run["log_every"]
        # in simulation, flushed by lines only: the file's order must not depend on wall time
        self.metrics = JsonLines(plan.run_dir / "metrics.jsonl",
                                 within=math.inf if plan.simulated else 1.0)
        self.sent = self.received = 0
        self.eval_time = 0.0  # evaluation time on the run's clock (real processes)
        self.paused = 0.0  # checkpoint time on the run's clock
        self.skipped = self.bad_in_a_row = 0  # steps whose loss or gradient was not finite
        self.wall_before = 0.0  # wall seconds of training before a resume
        self.log = plan.observer.log if plan.observer else EvalLog(
            plan.run_dir / "eval.jsonl", run["target_accuracy"])
        self.evaluated = 0  # the last step evaluated
        self.penultimate: float | None = None  # the clock after the second-to-last step
        self.level = 0  # how far this worker got: 2k in step k, 2k+1 once it stepped (recovery)
        self.spread = heterogeneity(plan.config["compute"], run["seed"])
        self.codec = plan.compressor.name != "none"
        replica.ctx.score = lambda: plan.score(self.model, self.t.device, self.rank)
        self.progress = Progress(self.steps, enabled=plan.progress and self.rank == 0)
        self.donated: set[tuple[int, int]] = set()  # (joiner, step): rejoin.donate
        self.events = LiveEvents(plan.run_dir, run["tensorboard"])
        self.start = self.wall_start = 0.0

    def run(self) -> dict[str, Any] | None:
        k = self.start_up() if getattr(self.t, "joining", None) is None else rejoin.join(self)
        every = self.plan.config["run"]["checkpoint_every"]
        while k < self.steps:
            try:
                rejoin.at_step(self, k)
                loss = self.step(k)
                if self.eval_every and (k + 1) % self.eval_every == 0:
                    self.evaluate(k + 1)
            except GroupBroken as e:  # a worker died: the survivors go on (recovery.py)
                k = recovery.recover(self, e)
                if self.plan.config["run"]["on_failure"] == "stop":
                    resume.save(self, k)  # the survivors' checkpoint; the launcher tells
                    self.progress.close()
                    return None
                continue
            self.progress.update(k + 1, loss, self.log.last and self.log.last[1])
            self.events.look(self.rank == self.leader, self.wall(),
                             None if self.plan.simulated else self.metrics.flush)
            if every and ((k + 1) % every == 0 or k + 1 == self.steps):
                resume.save(self, k + 1)
            stop = interrupt.stop_after(self.rank, k + 1) and k + 1 < self.steps
            resume.kill_if_asked(self.rank, k + 1)  # after its progress is recorded
            if stop:
                if not (every and (k + 1) % every == 0):
                    resume.save(self, k + 1)
                self.progress.close()
                return None  # Ctrl-C: the launcher says how to resume
            k += 1
        self.metrics.flush()
        self.progress.close()
        while True:
            try:
                return results.finish(self, self.wall())
            except GroupBroken as e:
                recovery.recover(self, e)

    def start_up(self) -> int:
        """Agree on the checkpoint to resume from, start the clock together, record what
        runs (once a resume took the checkpoint: a refused one leaves config.toml as it
        was); the step to start at."""
        hosts = [socket.gethostname()] if self.plan.simulated else host_names(self.t)
        saved = (checkpoint.agree_step(self.plan.run_dir, self.t,
                                       required=not self.plan.fresh_if_none)
                 if self.plan.resume else None)
        if saved and self.leads_node:
            checkpoint.cut_back(self.plan.run_dir, saved[0])
        self.t.barrier()  # everyone starts the clock together (setup is not training time)
        # a death before every worker got here stops them all (launch.py): a survivor may
        # still be in a start-up collective (the first model's broadcast) with the dead
        interrupt.set_ready(self.rank)
        self.t.off_clock()
        self.start, self.wall_start = self.t.now(), time.perf_counter()
        step = resume.restore(self, *saved) if saved else 0
        self.record_environment(hosts)
        return step

    def record_environment(self, hosts: list[str]) -> None:
        """config.toml (what ran) and environment.json (where, with what) in the run dir."""
        if self.rank == 0:
            (self.plan.run_dir / "config.toml").write_text(to_toml(self.plan.config))
            backend = ("simulated" if self.plan.simulated
                       else str(torch.distributed.get_backend()))
            write_json(self.plan.run_dir / "environment.json", environment(backend, hosts))

    def clock(self) -> float:
        """Seconds of training so far (wall, or virtual in the simulator), evaluation
        excluded."""
        return self.t.now() - self.start - self.eval_time - self.paused

    def wall(self) -> float:
        """Wall seconds of training so far, over every resume."""
        return self.wall_before + time.perf_counter() - self.wall_start

    def step(self, k: int) -> float:
        now, t = self.clock, self.t
        sent, received = t.bytes_sent, t.bytes_received
        self.reshard()
        self.level = 2 * k
        t0 = now()
        x, y = self.shard.batch(k)
        t1 = now()
        x, y = x.to(t.device, non_blocking=True), y.to(t.device, non_blocking=True)
        t2 = now()
        if not (self.own_zero_grad and all(p.grad is None for p in self.weights)):
            self.optimizer.zero_grad()  # else freed after the last step already (below)
        forward_end: list[float] = []
        value, finite = t.offload(lambda charged: self.forward_backward(x, y, charged),
                                  lambda: (t.compute("forward", k), forward_end.append(now())))
        t3 = forward_end[0]
        t.compute("backward", k)
        self.check_finite(k, value, finite)
        self.straggle(k, now() - t2)
        t4 = now()
        if self.codec:
            t.compute("codec", k)
        resume.kill_if_asked(self.rank, k + 1, "gradients")  # fault tests (tests/faults)
        self.replica.sync_gradients()
        t5 = now()
        t.offload(self.update, lambda: self.stepped(k))
        t6 = now()
        resume.kill_if_asked(self.rank, k + 1, "parameters")
        self.replica.sync_parameters()
        self.level = 2 * k + 2
        t7 = now()
        if k == self.steps - 2:
            self.penultimate = t7
        self.sent += t.bytes_sent - sent
        self.received += t.bytes_received - received
        if (k + 1) % self.log_every == 0 or k + 1 == self.steps:
            timings = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, (t5 - t4) + (t7 - t6), t6 - t5)
            timings = tuple(round(s, 9) for s in timings)  # to the ns: no float dust
            self.metrics.write({
                "step": k + 1, "rank": self.rank, "time": round(t7, 9), "loss": value,
                **dict(zip(PHASES, timings)),
                "bytes_sent": t.bytes_sent - sent, "bytes_received": t.bytes_received - received,
                "staleness": self.replica.ctx.stats.get("staleness", 0)})
        return value

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor,
                         charged: Callable[[], None]) -> tuple[float, bool]:
        """Forward, `charged()`, then backward unless the loss is not finite; the loss, and
        whether it and the gradients are finite (read here: the simulator may run this on a
        compute lane, transport.offload, and the gradients are still in its cache)."""
        loss = self.checked_step(self.replica.forward_module, (x, y))
        charged()
        value = float(loss.detach())
        if not math.isfinite(value):
            return value, False
        (loss * self.weight if self.weight != 1 else loss).backward()
        self.checked_step.backward_done()
        return value, all_finite([p.grad.detach() for p in self.weights if p.grad is not None])

    def update(self, charged: Callable[[], None]) -> None:
        """The optimizer step, then `charged()` (transport.offload)."""
        self.optimizer.step()
        # free the gradients now, not at the next step: 1 MB less per simulated MLP worker
        # while it waits for the others, and the next worker's backward takes the memory
        # while it is still in the cache (what zero_grad does, without its wrappers)
        for p in self.weights:
            p.grad = None
        charged()

    def stepped(self, k: int) -> None:
        self.level = 2 * k + 1
        self.t.compute("update", k)

    def reshard(self) -> None:
        """Workers were lost: the survivors split each global batch among themselves from
        now on, so no part of the data goes unseen (and allreduce stays large-batch SGD)."""
        members = self.t.members()
        if members != self.members:
            self.members = members
            self.shard = self.plan.shard(self.rank, self.world).among(members.index(self.rank),
                                                                       len(members))
            # parts may differ by a sample: each gradient weighs as many samples as it has,
            # so that the survivors' mean is the global batch's mean gradient
            start, end = self.shard.part
            self.weight = (end - start) * len(members) / (self.shard.batch_size * self.world)

    def check_finite(self, k: int, loss: float, finite: bool) -> None:
        """A NaN or inf loss or gradient (`finite` false): this worker's batch is skipped (its
        gradients are zero; it still takes its peers' part, so replicas stay in step) and
        counted. `run.max_bad_steps` in a row stop the run; the checkpoints already written
        stay."""
        if finite:
            self.bad_in_a_row = 0
            return
        self.skipped += 1
        self.bad_in_a_row += 1
        for p in self.weights:
            p.grad = None  # the strategies take a missing gradient as zero
        limit = self.plan.config["run"]["max_bad_steps"]
        if self.bad_in_a_row > limit:
            what = f"loss {loss}" if not math.isfinite(loss) else "a gradient not finite"
            raise UserError(f"worker {self.rank}: {what} at step {k + 1}, {self.bad_in_a_row} "
                            f"steps in a row (run.max_bad_steps = {limit}): training diverged "
                            "or the data is bad (lower optimizer.lr?)")

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

    def straggle(self, k: int, seconds: float) -> None:
        """On real processes, a slow worker (compute.slowdown, stragglers) sleeps the extra
        time its forward + backward would have taken; the simulator charges it itself."""
        factor = 1.0 if self.plan.simulated else self.spread.factor(self.rank, k)
        if factor > 1:
            time.sleep((factor - 1) * seconds)

    def evaluate(self, step: int) -> None:
        """Simulated: hand the replica to the observer, for free; real: a collective, every
        worker joins (observe.py)."""
        self.t.await_deferred()  # the model is read
        if self.plan.observer is None:
            return evaluate_together(self, step)
        self.evaluated = step
        self.plan.observer.hand_in(step, self.rank, self.model, self.clock(), self.wall(),
                                   self.score)
        self.t.off_clock()

    def score(self, model: torch.nn.Module) -> float:
        """The loss every worker scores a model by (Plan.score)."""
        return self.plan.score(model, self.t.device)
