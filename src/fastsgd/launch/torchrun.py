"""One worker of a torchrun job (Job.run under torchrun): its transport, the run directory
every rank agrees on, and Ctrl-C as store_stop.py says."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from fastsgd.config import schema as cfg
from fastsgd.control import interrupt
from fastsgd.control.store_stop import StoreStop
from fastsgd.errors import ConfigError, Interrupted, WorkerFailed
from fastsgd.launch.processes import backend_of
from fastsgd.loop.plan import Plan
from fastsgd.loop.worker import train
from fastsgd.strategies import CHOICES
from fastsgd.transport.rendezvous import peer_gone
from fastsgd.transport.torch_dist import TorchTransport

NO_JOIN = ("run.join = true lets processes from outside (fastsgd join) into `fastsgd run`'s "
           "own workers, not into {where}: {instead}")

PlanFn = Callable[[dict, TorchTransport], Plan]


def train_under_torchrun(config: dict, make_plan: PlanFn) -> tuple[dict[str, Any] | None, Plan]:
    """Train this process as the worker torchrun made it; `make_plan(config, transport)`
    resolves the job once the group is formed. Returns the summary and the plan."""
    run = config["run"]
    if run["join"]:
        raise ConfigError(NO_JOIN.format(where="torchrun", instead="torchrun's own "
                                         "--max-restarts restarts every worker"))
    if run["rejoin"]:  # torchrun's agent stops every worker when one dies: none to rejoin
        raise ConfigError("run.rejoin = true starts new processes in lost ones' places under "
                          "`fastsgd run` and the simulator, not under torchrun: torchrun's "
                          "own --max-restarts restarts every worker")
    transport = TorchTransport(backend_of(config), run["timeout"])
    stop = StoreStop(transport.store(), transport.rank, transport.world_size)
    interrupt.share(stop)
    failed = True
    try:
        config = cfg.merged(config, CHOICES, run={"workers": transport.world_size})
        plan = make_plan(config, transport)
        # SIGINT alone: torchrun's agent stops its workers with SIGTERM (a peer failed)
        with interrupt.catching(stop.on_sigint, (signal.SIGINT,)):
            summary = train(plan, transport)
        failed = False
        if 0 < stop.stop_at < plan.total_steps(transport.world_size):
            where = "" if transport.rank else (
                f"every worker stopped after step {stop.stop_at} and wrote a checkpoint; "
                f"resume with the same torchrun command and --resume {plan.run_dir}")
            raise Interrupted(f"interrupted: {where}" if where else "", stop.stop_at)
    except RuntimeError as e:
        if not peer_gone(e):
            raise
        # one line; under torchrun --max-restarts the agent then restarts every worker
        raise WorkerFailed(f"worker {transport.rank}: a peer is gone "
                           f"({str(e).splitlines()[0]})") from None
    finally:
        stop.close()
        interrupt.share(None)
        transport.close(failed)
    return summary, plan
