"""A training loop's checkpoints: what `worker._Loop` saves every `run.checkpoint_every`
steps and takes back on `--resume` (the files themselves: checkpoint.py).

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fastsgd.config.objects import import_path
from fastsgd.errors import UserError
from fastsgd.records.checkpoint import (
    commit,
    gather_digests,
    load,
    rank_file,
    rng_state,
    save_worker,
    set_rng_state,
)

if TYPE_CHECKING:
    from fastsgd.loop.worker import _Loop as Loop


def save(loop: Loop, step: int) -> None:
    """A checkpoint after `step` steps, off the training clock."""
    loop.metrics.flush()
    loop.t.await_deferred()  # the model is read
    began = loop.t.now()
    loop.replica.settle()
    loop.t.barrier()
    state = {"step": step, "model": loop.model.state_dict(),
             "optimizer": loop.optimizer.state_dict(),
             "replica": loop.replica.state_dict(), "loop": loop_state(loop, began),
             "rng": rng_state(), "written_by": written_by(loop)}
    if loop.plan.simulated:
        state["sim"] = sim_state(loop, step)
    digest = save_worker(loop.plan.run_dir, step, loop.rank, state)
    kill_if_asked(loop.rank, step, "checkpoint")
    complete(loop, step, digest, began)
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
    FASTSGD_TEST_KILL_AFTER_CHECKPOINT=STEP kills every worker right after that checkpoint."""
    target = os.environ.get("FASTSGD_TEST_KILL", "")
    if not target:
        return  # called three times a step: nothing more to look up in a normal run
    restarted = (os.environ.get("FASTSGD_RESTART", "0") != "0"
                 or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0")
    asked = target if target.count(":") == 2 else f"{target}:step"
    if asked == f"{rank}:{step}:{where}" and not restarted:
        os.kill(os.getpid(), signal.SIGKILL)


def complete(loop: Loop, step: int, digest: bytes, began: float,
             write_manifest: bool = True) -> None:
    """The checkpoint's second half: digests to the manifest, the time it took off the
    clock. A resumed simulation replays it (without the manifest) to end at the same time."""
    digests = gather_digests(digest, loop.t)
    if write_manifest and loop.leads_node:
        commit(loop.plan.run_dir, step, digests, loop.plan.config["run"]["keep_checkpoints"],
               loop.t.members(), loop.t.world_size)
    # nobody goes on before the manifest is in: a worker that died right after its part
    # got the others stopped while the leader was still committing (CI saw no complete
    # checkpoint after a kill -9 at a checkpoint's step)
    loop.t.barrier()
    loop.paused += loop.t.now() - began


def written_by(loop: Loop) -> dict[str, list[str]]:
    """What made the model and the optimizer: their config names and classes."""
    config = loop.plan.config
    return {key: [str(config[key]["name"]), import_path(type(made))]
            for key, made in (("model", loop.model), ("optimizer", loop.optimizer))}


def load_states(loop: Loop, saved: dict[str, Any], path: Path) -> None:
    """Model, optimizer and strategy state from checkpoint file `path`, or one line naming
    the key (model.name, optimizer.name) that differs from the run's that wrote it."""
    config, then = loop.plan.config, saved.get("written_by", {})  # not in older checkpoints
    for key, (name, made) in written_by(loop).items():
        if key in then and then[key][1] != made:
            raise UserError(f"{path} was written by another {key}: {key}.name = "
                            f"'{then[key][0]}', not '{name}'; resume with that {key}.name, "
                            "or start a new run")
    settings = _settings(loop.optimizer)
    for key, target in (("model", loop.model), ("optimizer", loop.optimizer),
                        ("replica", loop.replica)):
        section = "strategy" if key == "replica" else key
        try:
            target.load_state_dict(saved[key])
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError):
            # torch's own errors: tensors missing, unexpected or of other shapes
            raise UserError(f"{path} was written by another {section}: it does not fit "
                            f"{section}.name = '{config[section]['name']}'; resume with the "
                            f"{section}.name it was written with, or start a new run") from None
    for group, own in zip(loop.optimizer.param_groups, settings, strict=True):
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


def loop_state(loop: Loop, began: float) -> dict[str, Any]:
    return {"sent": loop.sent, "received": loop.received, "eval_time": loop.eval_time,
            "paused": loop.paused, "evaluated": loop.evaluated, "clock": loop.clock(),
            "start": loop.start, "began": began, "wall": loop.wall(),
            "penultimate": getattr(loop, "penultimate", None),
            "skipped": [loop.skipped, loop.bad_in_a_row],
            "log": loop.log.state()}


def sim_state(loop: Loop, step: int) -> dict[str, Any]:
    fabric = loop.t.fabric
    if fabric.in_flight():
        raise UserError(f"strategy '{loop.plan.config['strategy']['name']}' has messages "
                        f"in flight at step {step}: the simulator cannot checkpoint it yet "
                        "(set run.checkpoint_every = 0)")
    return {"clock": loop.t.now_ns(), "fabric": fabric.state() if loop.rank == 0 else None}


def restore(loop: Loop, step: int, data: bytes) -> int:
    """Continue from the checkpoint of `step` (this worker's file, `data`): model,
    optimizer and strategy state, random streams, counters and clocks. Returns the next
    step."""
    if step >= loop.steps:
        raise UserError(f"{loop.plan.run_dir} is complete: its checkpoint is at step {step} "
                        f"and the run has {loop.steps} steps; to train longer, --set "
                        "run.steps to more")
    saved = load(data)
    if "sim" in saved and not loop.plan.simulated:
        raise UserError(f"the checkpoint in {loop.plan.run_dir} was written by fastsgd "
                        f"simulate: resume it with fastsgd simulate --resume "
                        f"{loop.plan.run_dir}")
    load_states(loop, saved, rank_file(loop.plan.run_dir, step, loop.rank))
    set_rng_state(saved["rng"])
    was = saved["loop"]
    loop.sent, loop.received = was["sent"], was["received"]
    loop.eval_time, loop.paused = was["eval_time"], was["paused"]
    loop.evaluated, loop.wall_before = was["evaluated"], was["wall"]
    loop.skipped, loop.bad_in_a_row = was["skipped"]
    if was["penultimate"] is not None:
        loop.penultimate = was["penultimate"]
    if loop.rank == 0:
        loop.log.load(was["log"])
    if "sim" not in saved:
        loop.start = loop.t.now() - was["clock"] - loop.eval_time - loop.paused
        return step
    loop.t.set_clock(saved["sim"]["clock"])
    if saved["sim"]["fabric"] is not None:
        loop.t.fabric.load_state(saved["sim"]["fabric"])
    loop.start = was["start"]
    complete(loop, step, bytes(32), was["began"], write_manifest=False)
    return step
