"""A training loop's start and checkpoints: what a worker saves every
`run.checkpoint_every` steps and takes back on `--resume` (the files themselves:
records/checkpoint.py): the model, the optimizer, the strategy and the loop's `LoopState`.

A checkpoint is a collective: a barrier (in the simulator every worker then sees the same
random state, and nothing is in flight for the strategies that allow checkpoints there),
every worker's file, then the digests gathered for the manifest. Its time is kept off the
training clock. A resumed simulation restores each worker's virtual clock and the links'
state, and replays the gather, so that its times go on exactly as the run's that never
stopped.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import torch

from fastsgd.config.objects import import_path
from fastsgd.config.schema import to_toml
from fastsgd.control import interrupt
from fastsgd.errors import UserError
from fastsgd.loop.context import LoopContext
from fastsgd.records import checkpoint
from fastsgd.records.checkpoint import (
    commit,
    gather_digests,
    load,
    rank_file,
    save_worker,
)
from fastsgd.records.metrics import write_json
from fastsgd.records.rng import rng_state, set_rng_state
from fastsgd.records.rundir import environment, host_names


def save(ctx: LoopContext, step: int) -> None:
    """A checkpoint after `step` steps, off the training clock."""
    ctx.metrics.flush()
    ctx.t.await_deferred()  # the model is read
    began = ctx.t.now()
    ctx.replica.settle()
    ctx.t.barrier()
    state = {"step": step, "model": ctx.model.state_dict(),
             "optimizer": ctx.optimizer.state_dict(),
             "replica": ctx.replica.state_dict(), "loop": loop_state(ctx, began),
             "rng": rng_state(), "precision": ctx.precision.state_dict(),
             "written_by": written_by(ctx)}
    if ctx.plan.simulated:
        state["sim"] = sim_state(ctx, step)
    digest = save_worker(ctx.plan.run_dir, step, ctx.rank, state)
    kill_if_asked(ctx.rank, step, "checkpoint")
    complete(ctx, step, digest, began)
    if os.environ.get("FASTSGD_TEST_KILL_AFTER_CHECKPOINT") == str(step):
        os.kill(os.getpid(), signal.SIGKILL)


def kill_if_asked(rank: int, step: int, where: str = "step") -> None:
    """Fault tests: FASTSGD_TEST_KILL=RANK:STEP kills worker RANK (kill -9) once it has done
    STEP steps; RANK:STEP:checkpoint, while it writes the checkpoint of STEP (its file is
    in, the manifest not yet); RANK:STEP:gradients and RANK:STEP:parameters, in step STEP
    just before its gradient or parameter exchange (allreduce's buckets are then already
    in flight, launched during backward: a death mid-collective); RANK:STEP:evaluation, as
    the evaluator of STEP computes the accuracy (after the evaluation's collectives). Only in
    a run's first
    attempt, not again after a restart by fastsgd run or torchrun.
    FASTSGD_TEST_KILL_AFTER_CHECKPOINT=STEP kills every worker right after that checkpoint.
    FASTSGD_TEST_STOP=RANK:STEP stops worker RANK (SIGSTOP: alive, stalled) after STEP."""
    if os.environ.get("FASTSGD_TEST_STOP") == f"{rank}:{step}" and where == "step":
        os.kill(os.getpid(), signal.SIGSTOP)
    target = os.environ.get("FASTSGD_TEST_KILL", "")
    if not target:
        return  # called three times a step: nothing more to look up in a normal run
    restarted = (os.environ.get("FASTSGD_RESTART", "0") != "0"
                 or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0")
    asked = target if target.count(":") == 2 else f"{target}:step"
    if asked == f"{rank}:{step}:{where}" and not restarted:
        os.kill(os.getpid(), signal.SIGKILL)


def complete(ctx: LoopContext, step: int, digest: bytes, began: float,
             write_manifest: bool = True) -> None:
    """The checkpoint's second half: digests to the manifest, the time it took off the
    clock. A resumed simulation replays it (without the manifest) to end at the same time."""
    digests = gather_digests(digest, ctx.t)
    if write_manifest and ctx.leads_node:
        commit(ctx.plan.run_dir, step, digests, ctx.plan.config["run"]["keep_checkpoints"],
               ctx.t.members(), ctx.t.world_size)
    # nobody goes on before the manifest is in: a worker that died right after its part
    # got the others stopped while the leader was still committing (CI saw no complete
    # checkpoint after a kill -9 at a checkpoint's step)
    ctx.t.barrier()
    ctx.state.paused += ctx.t.now() - began


def written_by(ctx: LoopContext) -> dict[str, list[str]]:
    """What made the model and the optimizer: their config names and classes."""
    config = ctx.plan.config
    return {key: [str(config[key]["name"]), import_path(type(made))]
            for key, made in (("model", ctx.model), ("optimizer", ctx.optimizer))}


def load_states(ctx: LoopContext, saved: dict[str, Any], path: Path) -> None:
    """Model, optimizer and strategy state from checkpoint file `path`, or one line naming
    the key (model.name, optimizer.name) that differs from the run's that wrote it."""
    config, then = ctx.plan.config, saved.get("written_by", {})  # not in older checkpoints
    for key, (name, made) in written_by(ctx).items():
        if key in then and then[key][1] != made:
            raise UserError(f"{path} was written by another {key}: {key}.name = "
                            f"'{then[key][0]}', not '{name}'; resume with that {key}.name, "
                            "or start a new run")
    settings = _settings(ctx.optimizer)
    for key, target in (("model", ctx.model), ("optimizer", ctx.optimizer),
                        ("replica", ctx.replica)):
        section = "strategy" if key == "replica" else key
        try:
            target.load_state_dict(saved[key])
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            # torch's own errors: tensors missing, unexpected or of other shapes; the
            # replica's name the place in the strategy's state
            why = f" ({str(e).splitlines()[0]})" if key == "replica" else ""
            raise UserError(f"{path} was written by another {section}: it does not fit "
                            f"{section}.name = '{config[section]['name']}'{why}; resume with "
                            f"the {section}.name it was written with (and the fastsgd "
                            "version, the model), or start a new run") from None
    for group, own in zip(ctx.optimizer.param_groups, settings, strict=True):
        params = group["params"]
        group.clear()
        group.update(own, params=params)


def _settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each group's settings (lr, momentum, ... and a strategy's adjustment of them,
    staleness.py) as this run's config made them: torch's load_state_dict brings back the
    saved ones, and `--resume --set optimizer.lr=...` would be silently ignored. The saved
    state (momentum buffers, Adam's moments, step counts) is the checkpoint's."""
    return [{k: v for k, v in group.items() if k != "params"}
            for group in optimizer.param_groups]


def loop_state(ctx: LoopContext, began: float) -> dict[str, Any]:
    """The loop's state as a checkpoint or a joining worker takes it, with the evaluation
    log's and the time this checkpoint `began` (a resumed simulation replays its end)."""
    return {**ctx.state.state_dict(ctx.clock(), ctx.wall()), "began": began,
            "log": ctx.log.state(), "lost_before": ctx.lost_workers()}


def sim_state(ctx: LoopContext, step: int) -> dict[str, Any]:
    fabric = ctx.t.fabric
    if fabric.in_flight():
        raise UserError(f"strategy '{ctx.plan.config['strategy']['name']}' has messages "
                        f"in flight at step {step}: the simulator cannot checkpoint it yet "
                        "(set run.checkpoint_every = 0)")
    return {"clock": ctx.t.now_ns(), "fabric": fabric.state() if ctx.rank == 0 else None}


def restore(ctx: LoopContext, step: int, data: bytes) -> int:
    """Continue from the checkpoint of `step` (this worker's file, `data`): model,
    optimizer and strategy state, random streams, the loop's state and clocks. Returns the
    next step."""
    if step >= ctx.steps:
        raise UserError(f"{ctx.plan.run_dir} is complete: its checkpoint is at step {step} "
                        f"and the run has {ctx.steps} steps; to train longer, --set "
                        "run.steps to more")
    saved = load(data)
    if "sim" in saved and not ctx.plan.simulated:
        raise UserError(f"the checkpoint in {ctx.plan.run_dir} was written by fastsgd "
                        f"simulate: resume it with fastsgd simulate --resume "
                        f"{ctx.plan.run_dir}")
    load_states(ctx, saved, rank_file(ctx.plan.run_dir, step, ctx.rank))
    set_rng_state(saved["rng"])
    ctx.precision.load_state_dict(saved.get("precision", {}))  # checkpoints before fp16's had none
    was = saved["loop"]
    ctx.state.load_state_dict(was)
    if ctx.rank == 0:
        ctx.log.load(was["log"])
    if "sim" not in saved:
        ctx.start_clocks(was["clock"])
        return step
    ctx.t.set_clock(saved["sim"]["clock"])
    if saved["sim"]["fabric"] is not None:
        ctx.t.fabric.load_state(saved["sim"]["fabric"])
    complete(ctx, step, bytes(32), was["began"], write_manifest=False)
    return step


def start(ctx: LoopContext) -> int:
    """Agree on the checkpoint to resume from, start the clock together, record what
    runs (once a resume took the checkpoint: a refused one leaves config.toml as it
    was); the step to start at."""
    plan, t = ctx.plan, ctx.t
    hosts = [socket.gethostname()] if plan.simulated else host_names(t)
    saved = (checkpoint.agree_step(plan.run_dir, t, required=not plan.fresh_if_none)
             if plan.resume else None)
    if saved and ctx.leads_node:
        checkpoint.cut_back(plan.run_dir, saved[0])
    t.barrier()  # everyone starts the clock together (setup is not training time)
    # a death before every worker got here stops them all (launch.py): a survivor may
    # still be in a start-up collective (the first model's broadcast) with the dead
    interrupt.set_ready(ctx.rank)
    t.off_clock()
    ctx.start_clocks()
    step = restore(ctx, *saved) if saved else 0
    if ctx.rank == 0:  # config.toml (what ran), environment.json (where, with what)
        (plan.run_dir / "config.toml").write_text(to_toml(plan.config))
        backend = "simulated" if plan.simulated else str(torch.distributed.get_backend())
        write_json(plan.run_dir / "environment.json", environment(backend, hosts))
    return step
