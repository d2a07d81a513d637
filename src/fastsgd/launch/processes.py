"""How `fastsgd run`'s own worker processes start, go on without a lost one, and take a
new one in its place: the launcher's side of Job.run (see launch.py, supervise.py)."""

from __future__ import annotations

import os
from typing import Any

from fastsgd.config.objects import is_import_path, not_rebuildable
from fastsgd.control import interrupt
from fastsgd.errors import UserError
from fastsgd.launch.door import ENDED_WELL, FAILED, Door
from fastsgd.launch.forking import worker_environment
from fastsgd.loop.plan import Plan
from fastsgd.loop.worker import train
from fastsgd.records.rundir import DOOR
from fastsgd.strategies import STRATEGIES, capabilities_of
from fastsgd.strategies.membership import (
    carries_on_for_real,
    first_expendable,
    shrinks_for_real,
)
from fastsgd.transport.rendezvous import pick_backend
from fastsgd.transport.torch_dist import TorchTransport


def backend_of(config: dict[str, Any], strategy: object | None = None) -> str:
    """run.backend, where `auto` keeps a strategy that shares host memory (Hogwild:
    capabilities.host_memory) on gloo even where every worker has a GPU. The strategy is
    `strategy`, else the class config names (a built-in's, or an import path's)."""
    name, backend = config["strategy"]["name"], config["run"]["backend"]
    if backend != "auto":
        return backend
    if strategy is None and (name in STRATEGIES or is_import_path(name)
                             and not not_rebuildable(name)):
        strategy = STRATEGIES.get(name)
    shares = strategy is not None and capabilities_of(strategy).host_memory
    return "gloo" if shares else backend


def survives(plan: Plan) -> str | None:
    """How `fastsgd run`'s own workers go on without a dead one: "carry_on" (the strategy
    waits for no collective while training), "shrink" (run.on_failure, a synchronous
    strategy that can, on gloo: transport/shrink.py; with run.on_failure = "stop" the
    survivors write a checkpoint and stop), or None: every worker restarts from the last
    checkpoint, or stops. Strategies that carry on do not with checkpoints: a checkpoint of
    their survivors is not built yet."""
    run = plan.config["run"]
    if not _on_gloo(plan):  # an NCCL group neither goes on without a member nor takes one in
        return None
    if run["on_failure"] != "restart" and shrinks_for_real(plan.strategy, plan.compressor):
        return "shrink"  # then, with "stop", the survivors write a checkpoint and stop
    if run["checkpoint_every"] or run["on_failure"] == "stop":
        return None
    if carries_on_for_real(plan.strategy, plan.compressor):
        return "carry_on"
    return None


def _on_gloo(plan: Plan) -> bool:
    return pick_backend(backend_of(plan.config, plan.strategy),
                        local=plan.config["run"]["workers"]) == "gloo"


def expendable(plan: Plan) -> int | None:
    """The lowest rank whose death the others survive; None: no rank's."""
    mode = survives(plan)
    return None if mode is None else 0 if mode == "shrink" else first_expendable(plan.strategy)


def rejoin_steps(plan: Plan) -> int | None:
    """run.rejoin: the run's steps, for the launcher to start a new worker in place of a
    lost one; None: no."""
    return _joinable_steps(plan, "rejoin") if plan.config["run"]["rejoin"] else None


def door_of(plan: Plan) -> Door | None:
    """run.join: the door through which a process from outside (fastsgd join) takes a lost
    worker's place (door.py); None: no."""
    if not plan.config["run"]["join"]:
        return None
    return Door(plan.run_dir / DOOR, _joinable_steps(plan, "join"))


def _joinable_steps(plan: Plan, key: str) -> int:
    """The run's steps, once sure that the strategy carries on without a lost worker and
    takes a new one in its place (capabilities.rejoins); else UserError naming run.`key`."""
    name = plan.config["strategy"]["name"]
    if not _on_gloo(plan):
        raise UserError(f"run.{key} = true needs run.backend = 'gloo': an NCCL group cannot "
                        "take a new worker in")
    rejoins = capabilities_of(plan.strategy).rejoins
    if survives(plan) != "carry_on" or plan.compressor.kind not in rejoins:
        takers = [f"{n}{'' if len(kinds) > 1 else ' (exact codecs)'}" for n in STRATEGIES
                  if (kinds := capabilities_of(STRATEGIES.get(n)).rejoins)]
        raise UserError(f"run.{key} = true needs a strategy that carries on without a lost "
                        f"worker and takes a new one in its place: {', '.join(takers)}, and "
                        f"run.checkpoint_every = 0 (strategy '{name}', codec "
                        f"'{plan.compressor.name}')")
    return plan.total_steps(plan.config["run"]["workers"])


def train_process(plan: Plan) -> None:
    run = plan.config["run"]
    transport = TorchTransport(backend_of(plan.config, plan.strategy), run["timeout"])
    failed = True  # a stop (Ctrl-C, run.on_failure = "stop") ends train() as its end does
    try:
        mode = survives(plan)
        if mode == "carry_on":
            transport.carry_on()
        elif mode == "shrink":
            transport.shrinkable()
        if interrupt.joining() is not None:  # the others are ready once started up (worker.py)
            interrupt.set_ready(transport.rank)
        train(plan, transport)
        failed = False
    finally:
        transport.close(failed)


def train_joined(plan: Plan, stop: interrupt.Stop, join: str) -> None:
    """In `fastsgd join`: train as the worker the launcher let in at its door (door.knock's
    "RANK:STEP:DONOR:SINCE"), and tell it how this process ended."""
    rank, _, os.environ["FASTSGD_JOIN"] = join.partition(":")
    os.environ["FASTSGD_REJOIN"] = "1"
    worker_environment(int(rank), stop.slots["workers"], stop.slots["port"])
    interrupt.share(stop)
    ended = FAILED
    try:
        train_process(plan)
        ended = ENDED_WELL
    finally:
        stop.slots.arrays["ended"][int(rank)] = ended
