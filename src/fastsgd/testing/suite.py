"""`check_strategy` and `check_codec`: the whole conformance suite for one class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastsgd.strategies import capabilities_of
from fastsgd.testing import checks
from fastsgd.testing.codec import codec_contract
from fastsgd.testing.tiny import Subject, TinyJob, folder, subject


def _run(strategy: Subject, codec: Subject, real: bool, workers: int, steps: int,
         tolerance: float, out: str | Path | None) -> list[str]:
    """Every check that applies; the names of those that ran."""
    capabilities = capabilities_of(strategy.make())
    ran = []
    with folder(out) as place:
        job = TinyJob(strategy, codec, workers, steps, place)
        if capabilities.real_only:  # no simulator: it must at least end cleanly
            checks.ends_cleanly(job, job.real("real").run_dir)
            return ["ends cleanly (real processes)"]
        checks.determinism(job)
        checks.ends_cleanly(job, place / "determinism-a")
        ran.append("determinism")
        if capabilities.checkpoints:
            checks.resume(job)
            ran.append("resume")
        checks.drain(job)
        ran.append("drain")
        if real:
            checks.real_equals_simulated(job, tolerance)
            ran.append("real equals simulated")
    return ran


def check_strategy(strategy: str | type, codec: str | type = "none", *, real: bool = False,
                   workers: int = 2, steps: int = 24, tolerance: float = 1e-5,
                   out: str | Path | None = None, **options: Any) -> list[str]:
    """Check a strategy class on the tiny job (an MLP on `digits`); the checks that ran.

    `strategy`: a built-in name, `module:Class`, or the class; `options` are its options
    (e.g. `fraction=0.1`), checked against its OPTIONS. The checks: two simulated runs give
    the same bits (determinism); a run resumed from its checkpoint halfway ends bitwise as
    the run that never stopped (resume; not where capabilities.checkpoints is False); every
    worker does every step and nothing is left in flight at the end (drain); with
    `real=True`, real processes end within `tolerance` of the simulator (for strategies whose
    arithmetic does not depend on timing). A failure raises AssertionError in one line
    naming the class and the property. Runs go to `out`, else to a temporary folder; a
    class that breaks the contract (fastsgd.StrategyBase) raises ConfigError first.
    """
    return _run(subject("strategy", strategy, options), subject("codec", codec, {}), real,
                workers, steps, tolerance, out)


def check_codec(codec: str | type, strategy: str | type = "allreduce", *, real: bool = False,
                workers: int = 2, steps: int = 24, tolerance: float = 1e-5,
                out: str | Path | None = None, **options: Any) -> list[str]:
    """Check a codec class: its own contract on tensors (payload fields, decoded shape and
    dtype, exactness of an `exact` codec), then the checks of `check_strategy` with
    `strategy` carrying it. `options` are the codec's."""
    chosen = subject("codec", codec, options)
    codec_contract(chosen.make(), chosen.label)
    return ["contract", *_run(subject("strategy", strategy, {}), chosen, real, workers, steps,
                              tolerance, out)]
