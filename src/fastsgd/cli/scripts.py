"""The job a training script defines, for `fastsgd pack train.py`."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastsgd.config import schema as cfg
from fastsgd.errors import UserError
from fastsgd.job import Job
from fastsgd.strategies import CHOICES


def job_from_source(source: str, overrides: dict[str, Any]) -> tuple[Job, str]:
    """The job `fastsgd pack SOURCE` packs (train.py, train.py:NAME or a TOML config), and
    the archive's default name."""
    if source.endswith(".fsj") and Path(source).is_file():
        raise UserError(f"{source} is a job archive already: train it with fastsgd run {source}")
    path, colon, name = source.partition(".py:")
    if colon and not name:
        raise UserError(f"{source}: the job's name after ':' is empty; write {source}NAME")
    if path.endswith(".py") or colon:
        script = path if path.endswith(".py") else f"{path}.py"
        job = job_from_script(script, name or None, overrides)
    else:
        job = Job(config=path, options=overrides)
    return job, f"{Path(path).stem}.fsj"


def job_from_script(script: str | Path, name: str | None,
                    overrides: dict[str, Any]) -> Job:
    """Import `script` as a module (its `if __name__ == "__main__":` part does not run) and
    return the fastsgd.Job it defines at module level, or the one called `name`."""
    path = Path(script).resolve()
    if not path.is_file():
        raise UserError(f"{script}: no such file")
    module = _import(path, str(script))
    jobs = {k: v for k, v in vars(module).items() if isinstance(v, Job)}
    if name is not None:
        if name not in jobs:
            raise UserError(f"{script} defines no fastsgd.Job called {name!r} at module level "
                            f"(it defines: {', '.join(jobs) or 'none'})")
        job = jobs[name]
    elif len(jobs) == 1:
        job = next(iter(jobs.values()))
    elif not jobs:
        raise UserError(f"{script} defines no fastsgd.Job at module level; write e.g. "
                        "job = fastsgd.Job(model=MyNet, step=my_step), or pack a TOML config")
    else:
        raise UserError(f"{script} defines {len(jobs)} jobs ({', '.join(jobs)}): pick one "
                        f"with {script}:NAME")
    held = [key for key in overrides if key.startswith("model.")]
    if held:
        raise UserError(f"--set {held[0]}: the job in {script} holds its model and step; "
                        "change them there, or pack a TOML config")
    if overrides:  # as `--set` on a config file: another strategy drops the old one's keys
        raw = cfg.with_options(job.config, overrides, CHOICES, str(script))
        job.config = cfg.validate(raw, CHOICES)
    return job


def _import(path: Path, argv0: str) -> Any:
    """The script as a module named by its file (`train.py`, so that what errors name of it,
    `train.py:MyOptimizer`, points at the file), its argv the one `python train.py` gives."""
    sys.path.insert(0, str(path.parent))  # the script's own modules, as `python train.py`
    spec = importlib.util.spec_from_file_location(path.name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        with _argv(argv0):
            spec.loader.exec_module(module)
    except UserError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the script's own error, any kind
        raise _script_error(path, e) from None
    return module


@contextmanager
def _argv(argv0: str) -> Iterator[None]:
    """sys.argv is [argv0] meanwhile (a module-level argparse parses no fastsgd arguments)."""
    saved = sys.argv
    sys.argv = [argv0]
    try:
        yield
    finally:
        sys.argv = saved


def _script_error(path: Path, e: BaseException) -> UserError:
    """One line for an error in importing the user's script, at the script's line it came
    from (a module the script imports may have raised it)."""
    if isinstance(e, SyntaxError) and e.filename == str(path):
        return UserError(f"{path}: line {e.lineno}: {e.msg}")
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
    where = f", line {lines[-1]}" if lines else ""
    said = (str(e).strip().splitlines() or [""])[0]
    return UserError(f"{path}{where}: {type(e).__name__}: {said}")

