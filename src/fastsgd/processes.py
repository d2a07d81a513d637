"""How `fastsgd run`'s own worker processes start, go on without a lost one, and take a
new one in its place: the launcher's side of Job.run (see launch.py, supervise.py)."""

from __future__ import annotations

from typing import Any

from fastsgd import interrupt
from fastsgd.errors import UserError
from fastsgd.strategies import STRATEGIES
from fastsgd.strategies.membership import (
    carries_on_for_real,
    first_expendable,
    shrinks_for_real,
)
from fastsgd.transport.rendezvous import pick_backend
from fastsgd.transport.torch_dist import TorchTransport
from fastsgd.worker import Plan, train


def backend_of(config: dict[str, Any]) -> str:
    """run.backend, where `auto` keeps a strategy that shares host memory (Hogwild) on gloo
    even where every worker has a GPU."""
    name, backend = config["strategy"]["name"], config["run"]["backend"]
    shares = name in STRATEGIES and getattr(STRATEGIES.get(name), "HOST_MEMORY", False)
    return "gloo" if backend == "auto" and shares else backend


def survives(plan: Plan) -> str | None:
    """How `fastsgd run`'s own workers go on without a dead one: "carry_on" (the strategy
    waits for no collective while training), "shrink" (run.on_failure, a synchronous
    strategy that can, on gloo: transport/shrink.py; with run.on_failure = "stop" the
    survivors write a checkpoint and stop), or None: every worker restarts from the last
    checkpoint, or stops. Strategies that carry on do not with checkpoints: a checkpoint of
    their survivors is not built yet."""
    run = plan.config["run"]
    if (run["on_failure"] != "restart" and shrinks_for_real(plan.strategy, plan.compressor)
            and pick_backend(backend_of(plan.config), local=run["workers"]) == "gloo"):
        return "shrink"  # then, with "stop", the survivors write a checkpoint and stop
    if run["checkpoint_every"] or run["on_failure"] == "stop":
        return None
    if carries_on_for_real(plan.strategy, plan.compressor):
        return "carry_on"
    return None


def expendable(plan: Plan) -> int | None:
    """The lowest rank whose death the others survive; None: no rank's."""
    mode = survives(plan)
    return None if mode is None else 0 if mode == "shrink" else first_expendable(plan.strategy)


def rejoin_steps(plan: Plan) -> int | None:
    """run.rejoin: the run's steps, for the launcher to start a new worker in place of a
    lost one (the strategy must carry on without it and take it back: REJOINS); None: no."""
    if not plan.config["run"]["rejoin"]:
        return None
    name = plan.config["strategy"]["name"]
    if survives(plan) != "carry_on" or plan.compressor.kind not in getattr(
            plan.strategy, "REJOINS", ()):
        takers = [f"{n}{'' if len(kinds) > 1 else ' (exact codecs)'}" for n in STRATEGIES
                  if (kinds := getattr(STRATEGIES.get(n), "REJOINS", ()))]
        raise UserError(f"run.rejoin = true needs a strategy that carries on without a lost "
                        f"worker and takes a new one in its place: {', '.join(takers)}, and "
                        f"run.checkpoint_every = 0 (strategy '{name}', codec "
                        f"'{plan.compressor.name}')")
    return plan.total_steps(plan.config["run"]["workers"])


def train_process(plan: Plan) -> None:
    run = plan.config["run"]
    transport = TorchTransport(backend_of(plan.config), run["timeout"])
    try:
        mode = survives(plan)
        if mode == "carry_on":
            transport.carry_on()
        elif mode == "shrink":
            transport.shrinkable()
        if interrupt.joining() is not None:  # the others are ready once started up (worker.py)
            interrupt.set_ready(transport.rank)
        train(plan, transport)
    finally:
        transport.close()
