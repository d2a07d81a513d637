"""What a resume may do to a run: keep what makes it the same run (its seed, data, strategy
and codec), and train on only where steps are left."""

from __future__ import annotations

import json
from pathlib import Path

from fastsgd.config import schema as cfg
from fastsgd.errors import UserError
from fastsgd.records.checkpoint import steps
from fastsgd.strategies import CHOICES

# what a resume may not change: the run would no longer be one run (another data order,
# batch, exchange); steps, evaluation, checkpoints, timeouts and the optimizer's rates may
FIXED_ON_RESUME = ("run.seed", "run.accumulate", "data.", "strategy.", "compression.")


def check_unchanged(run_dir: Path, config: dict) -> None:
    """A resume of a run with checkpoints keeps what makes it the same run; else one line."""
    recorded = run_dir / "config.toml"
    if not steps(run_dir) or not recorded.is_file():
        return
    before = cfg.validate(cfg.read_toml(recorded), CHOICES)
    for section, values in config.items():
        for key, value in values.items():
            name = f"{section}.{key}"
            old = before.get(section, {}).get(key, value)
            if old != value and any(name.startswith(f) for f in FIXED_ON_RESUME):
                raise UserError(f"cannot resume {run_dir} with {name} = {value!r}: it was "
                                f"trained with {old!r}, and a run must keep its {name}; "
                                "resume with that, or start a new run")


def check_has_checkpoint(run_dir: Path) -> None:
    """A finished run without a checkpoint has nothing to train on from, however many steps
    are asked for: one line. Checked before the run directory is claimed, where a resume
    with a config would take a folder without a checkpoint for a run yet to start and clear
    it, over the finished run's results."""
    done = finished_steps(run_dir)
    if done is not None and not steps(run_dir):
        raise UserError(f"{run_dir} has finished ({done} steps) and has no checkpoint to train "
                        "on from: to train longer, start a new run (one with "
                        "run.checkpoint_every set can be resumed)")


def check_not_finished(run_dir: Path, total: int) -> None:
    """A run that ended has nothing to resume unless it is asked for more steps. (One whose
    last checkpoint is its end is told so by the workers, resume.py; one without any
    checkpoint by check_has_checkpoint; this is one that would train its last steps again
    from an earlier checkpoint.)"""
    done = finished_steps(run_dir)
    if done is not None and done >= total and max(steps(run_dir), default=0) < total:
        raise UserError(f"{run_dir} has finished: its {done} steps are done; to train on, "
                        f"resume with more (--set run.steps={done * 2}, say)")


def finished_steps(run_dir: Path) -> int | None:
    """The steps of a run that finished (its summary.json's), else None: not finished, or
    its summary is not one of ours to judge by."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    done = summary.get("steps") if isinstance(summary, dict) else None
    return done if isinstance(done, int) and not isinstance(done, bool) else None
