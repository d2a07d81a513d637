"""Supervising `fastsgd run`'s own worker processes: restarts after a dead worker, and the
one-line messages for a failure or a Ctrl-C, with the command that resumes the run.

A worker process that vanishes (kill -9, a lost machine) is a fault: unless the others go on
without it (processes.py `survives`) or `run.on_failure = "stop"`, every worker starts again, up
to `run.max_restarts` times, from the newest checkpoint (or from the start, the run
directory's logs cut back to it), and the summary lists what happened. A worker that raises,
or that crashes from within (SIGABRT, SIGSEGV...: control/crashes.py; a strategy whose
collectives differ between workers, say), is a bug or a user error, not a fault: the run
stops, and its one line names the worker, the step it was in and the run's strategy.
(Under torchrun its elastic agent restarts the workers: docs/multihost.md.)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastsgd.errors import Interrupted, WorkerFailed
from fastsgd.loop.plan import Plan
from fastsgd.records import checkpoint
from fastsgd.records.metrics import add_failure
from fastsgd.strategies.membership import first_expendable


def supervise(plan: Plan, attempt: Callable[[int], None]) -> list[dict[str, Any]]:
    """Run `attempt(k)` (k: restarts so far) until it ends well; returns the failures."""
    run, failures = plan.config["run"], []
    restarts = run["max_restarts"] if run["on_failure"] != "stop" else 0
    for k in range(restarts + 1):
        began = time.perf_counter()
        try:
            attempt(k)
            break
        except Interrupted as e:
            raise _interrupted(e, plan.run_dir) from None
        except WorkerFailed as e:
            if not e.died or k == restarts:
                raise _with_resume_hint(placed(e, plan), plan.run_dir) from None
            failures.append(_restart(plan, e, k + 1, restarts, time.perf_counter() - began))
    return failures


def placed(failure: WorkerFailed, plan: Plan) -> WorkerFailed:
    """A worker's failure that is not a death, with the step it was in and the run's
    strategy told after the worker ("worker 1 failed in step 3 of strategy 'x': ...");
    a death as it is (its peers' step says nothing of its cause)."""
    if failure.died or failure.rank is None:
        return failure
    steps = plan.total_steps(plan.config["run"]["workers"])
    strategy = f"strategy '{plan.config['strategy']['name']}'"
    if failure.step is None:
        return failure.placed(f" under {strategy}")
    if failure.step == 1 and plan.resume and checkpoint.steps(plan.run_dir):
        # no step counted yet in a run that resumes: it failed in its start-up
        return failure.placed(f" while resuming, before its first step, under {strategy}")
    if failure.step > steps:  # in what comes after the steps: the end's collectives
        return failure.placed(f" after the last step ({steps}) of {strategy}")
    return failure.placed(f" in step {failure.step} of {strategy}")


def _restart(plan: Plan, failure: WorkerFailed, restart: int, restarts: int,
             lost: float) -> dict[str, Any]:
    """A worker process died: every worker starts again from the newest checkpoint (or from
    the start, and the run directory's logs are cut back to it). One line says so."""
    steps = checkpoint.steps(plan.run_dir)
    plan.resume = bool(steps)
    if not steps:
        checkpoint.cut_back(plan.run_dir, 0)
    start = f"the checkpoint of step {steps[-1]}" if steps else "the start (no checkpoint)"
    print(f"fastsgd: {failure}{_why_not_without(plan, failure)}; restarting every worker "
          f"from {start} (restart {restart} of {restarts})", file=sys.stderr, flush=True)
    failed = {"event": str(failure), "restart": restart,
              "from_step": steps[-1] if steps else 0, "attempt_wall_time": round(lost, 3)}
    add_failure(plan.run_dir, failed)  # a resume of the run still tells it
    return failed


def _why_not_without(plan: Plan, failure: WorkerFailed) -> str:
    """Why the others do not carry on without a dead worker where they would without
    another: it held what only it had (a parameter server's shard)."""
    if failure.rank is None or failure.rank >= first_expendable(plan.strategy):
        return ""
    return (f" (it held a shard of strategy '{plan.config['strategy']['name']}''s "
            "parameter server, which the others cannot go on without)")


def _interrupted(stopped: Interrupted, run_dir: Path) -> Interrupted:
    where = (f"every worker stopped after step {stopped.step} and wrote a checkpoint"
             if stopped.step else "the workers had to be killed")
    hint = (f"; resume with: fastsgd run --resume {run_dir}" if checkpoint.steps(run_dir)
            else "")
    return Interrupted(f"interrupted: {where}{hint}", stopped.step)


def _with_resume_hint(failure: WorkerFailed, run_dir: Path) -> WorkerFailed:
    if not checkpoint.steps(run_dir):
        return failure
    return WorkerFailed(f"{failure}\nthe run can go on from its last checkpoint: "
                        f"fastsgd run --resume {run_dir}", failure.died, failure.rank,
                        failure.step)
