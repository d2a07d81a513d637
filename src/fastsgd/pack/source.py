"""The job a training script defines, for `fastsgd pack train.py`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from fastsgd import config as cfg
from fastsgd.errors import UserError
from fastsgd.job import Job


def job_from_script(script: str | Path, name: str | None,
                    overrides: dict[str, Any]) -> Job:
    """Import `script` as a module (its `if __name__ == "__main__":` part does not run) and
    return the fastsgd.Job it defines at module level, or the one called `name`."""
    path = Path(script).resolve()
    if not path.is_file():
        raise UserError(f"{script}: no such file")
    module = _import(path)
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
    if overrides:
        job.config = cfg.validate(cfg.merged(job.config, **_sections(overrides)))
    return job


def _import(path: Path) -> Any:
    sys.path.insert(0, str(path.parent))  # the script's own modules, as `python train.py`
    spec = importlib.util.spec_from_file_location(f"_fastsgd_pack_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise UserError(f"{path}: line {e.lineno}: {e.msg}") from None
    return module


def _sections(overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    sections: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    return sections
