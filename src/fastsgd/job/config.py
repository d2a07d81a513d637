"""A job's configuration, assembled: the TOML file, job archive or dict it starts from,
then the options, then what the objects given to `Job` record of themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastsgd import pack
from fastsgd.config import schema as cfg
from fastsgd.config.keys import KIT_KEYS
from fastsgd.config.schema import paths_from
from fastsgd.errors import UserError
from fastsgd.loop.components import record
from fastsgd.pack import ARCHIVE_SUFFIX, PACKED
from fastsgd.strategies import CHOICES


def assembled(config: str | Path | dict | None, options: dict[str, Any],
              given: dict[str, Any]) -> tuple[dict, dict[str, Any]]:
    """The job's validated config: `config` (a TOML file, a job archive or a dict), then
    `options`, then what the objects `given` record of themselves (components.record);
    and the options as applied."""
    if isinstance(config, (str, Path)) and str(config).endswith(ARCHIVE_SUFFIX):
        config, options = pack.archive_config(config, options)
    source = str(config) if isinstance(config, (str, Path)) else ""
    raw = cfg.read_toml(Path(config)) if isinstance(config, (str, Path)) else (config or {})
    # relative paths: a config file's from its folder, the others' from here; recorded
    # absolute, so that config.toml (and a resume) reads the same files from anywhere
    paths_from(raw, Path(source).resolve().parent if source else Path.cwd())
    chosen = {f"{section}.name": given[arg]
              for section, arg in (("strategy", "strategy"), ("compression", "compressor"))
              if isinstance(given[arg], str)}  # a name given here picks as options do
    options = cfg.absolute_options({**options, **chosen})
    raw = cfg.with_options(raw, options, CHOICES, source)
    run = raw.get("run")
    seed = run.get("seed", 0) if isinstance(run, dict) else 0
    for section, values in record(**given, seed=seed).items():
        arg = given.get("compressor" if section == "compression" else section)
        if section in ("optimizer", "strategy", "compression") and not isinstance(arg, str):
            _check_not_both(section, options)
            # an object replaces the section: it is all there is, but for what the loop
            # does around any optimizer (its schedule, clipping)
            kit = {k: v for k, v in raw.get(section, {}).items() if k in KIT_KEYS} \
                if section == "optimizer" else {}
            raw[section] = {**values, **kit}
        else:
            raw.setdefault(section, {}).update(values)
    _packed_defaults(raw)
    return cfg.validate(raw, CHOICES), options


def resume_config(run_dir: Path, config: str | Path | dict | None) -> str | Path | dict:
    """`Job(resume=RUN_DIR)` reads RUN_DIR/config.toml unless given another config."""
    if config is not None:
        return config
    path = run_dir / "config.toml"
    if not path.is_file():
        raise UserError(f"cannot resume {run_dir}: no config.toml there (not a run directory)")
    return path


def _check_not_both(section: str, options: dict[str, Any]) -> None:
    """An option of a section that an object given to Job fills: the object's would win."""
    argument = {"compression": "compressor"}.get(section, section)
    for key in options:
        name = key.partition(".")[2]
        if key.startswith(f"{section}.") and name != "name" and name not in (
                KIT_KEYS if section == "optimizer" else ()):
            raise UserError(f"{key} in options, beside the {argument} argument, which sets "
                            f"its own: set it there (or name the {argument} by "
                            f"{section}.name and keep {key})")


def check_resume_options(run_dir: Path, options: dict[str, Any], overwrite: bool) -> None:
    """A resume goes on in its own folder: another run.out, or overwrite, would be ignored."""
    out = options.get("run.out")
    if out and Path(out).resolve() != run_dir.resolve():
        raise UserError(f"run.out = '{out}' with a resume of {run_dir}: a resume goes on in "
                        "the run's own folder (copy the folder to resume elsewhere)")
    if overwrite:
        raise UserError(f"overwrite (--overwrite) with a resume of {run_dir}: a resume goes "
                        "on from the run's checkpoint, keeping its folder")


def _packed_defaults(raw: dict) -> None:
    """model.packed alone: model.name and model.step are 'packed', the archive's (a model
    or step given besides, by name or as an object, is still refused: Job._packed)."""
    section = raw.get("model")
    if isinstance(section, dict) and section.get("packed"):
        section.setdefault("name", PACKED)
        section.setdefault("step", PACKED)
