"""A checkpoint's manifest.json, the file that makes it complete: {"format", "step",
"workers", "sha256"}, one SHA-256 (hex) per worker, null for a worker lost before it.

A manifest is read only if it has the shape written here: one damaged by hand or by the disk
(not JSON, another type, a list of digests of another length, no digest at all) is
`Damaged`, which a resume reports in one line before it takes an earlier checkpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

NAME = "manifest.json"
_DIGEST = re.compile(r"[0-9a-f]{64}")


class Damaged(Exception):
    """A manifest that cannot be read or is not one fastsgd writes; says what is wrong."""


def encoded(fmt: int, step: int, workers: int, digests: list[str | None]) -> bytes:
    """The manifest of a checkpoint of `step`: `digests`, worker by worker."""
    manifest = {"format": fmt, "step": step, "workers": workers, "sha256": digests}
    return (json.dumps(manifest, indent=1) + "\n").encode()


def read(folder: Path, step: int) -> dict[str, Any]:
    """The manifest in the checkpoint folder of `step`, checked (Damaged if it is not one)."""
    try:
        manifest = json.loads((folder / NAME).read_text())
    except OSError as e:
        raise Damaged(e.strerror or str(e)) from None
    except ValueError as e:  # not JSON, or not UTF-8
        raise Damaged(str(e)) from None
    problem = _problem(manifest, step)
    if problem:
        raise Damaged(problem)
    return manifest


def _problem(manifest: Any, step: int) -> str | None:
    """What makes `manifest` (parsed JSON) not a manifest of `step`, if anything."""
    if not isinstance(manifest, dict):
        return f"{NAME} holds a {type(manifest).__name__}, not an object"
    workers, digests = manifest.get("workers"), manifest.get("sha256")
    if manifest.get("step") != step or not _whole(manifest.get("step")):
        return f"its step is {manifest.get('step')!r}, not {step}"
    if not _whole(workers) or workers < 1:
        return f"its workers is {workers!r}, not a number of workers"
    if not isinstance(digests, list) or len(digests) != workers:
        return f"its sha256 is not a list of {workers} digests"
    for rank, digest in enumerate(digests):
        if digest is not None and not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
            return f"its sha256 of worker {rank} is {digest!r}, not a SHA-256"
    if all(digest is None for digest in digests):
        return "its sha256 names no worker's file"
    return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def damaged(checkpoints: list[tuple[Path, int]]) -> list[tuple[Path, str]]:
    """Those of the `checkpoints` (folder, step) whose manifest is damaged, and what is wrong."""
    found = []
    for folder, step in checkpoints:
        try:
            read(folder, step)
        except Damaged as e:
            found.append((folder, str(e)))
    return found


def workers_of(folders: list[tuple[Path, int]]) -> int | None:
    """The number of workers of the first of the checkpoint `folders` (folder, step) whose
    manifest is sound, if any."""
    for folder, step in folders:
        try:
            return read(folder, step)["workers"]
        except Damaged:
            continue
    return None
