"""Checkpoints: what a run needs to continue, written so that a crash never leaves half of one.

Layout, in the run directory:

    checkpoints/step-00000050/rank-00003.pt    one file per worker (its own replica)
    checkpoints/step-00000050/manifest.json    written last: {"step", "workers", "sha256"}

Every file is written to a temporary name, fsynced, renamed, and its directory fsynced: a
reader sees the old file or the new one, never a torn one, and a full disk leaves the
previous checkpoint as it was. A checkpoint counts only once its manifest is in, and a
worker's file only if its SHA-256 is the manifest's: a corrupt or truncated file is found
and the previous checkpoint used, with one line that says so. Files are read with
`torch.load(weights_only=True)`, which never unpickles code.

Each worker writes its own file, so nodes need no shared filesystem: every node's first
worker writes the manifest beside its workers' files, and on resume all workers agree on the
newest step every one of them holds intact (`agree_step`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from fastsgd.errors import UserError
from fastsgd.records import manifest
from fastsgd.transport.base import Transport

FORMAT = 1
FOLDER = "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / FOLDER / f"step-{step:08d}"


def rank_file(run_dir: Path, step: int, rank: int) -> Path:
    return step_dir(run_dir, step) / f"rank-{rank:05d}.pt"


def write_atomic(path: Path, data: bytes) -> None:
    """Temporary file, fsync, rename, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_worker(run_dir: Path, step: int, rank: int, state: dict[str, Any]) -> bytes:
    """Write worker `rank`'s state for `step`; returns the file's SHA-256 digest."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buffer)
    data = buffer.getvalue()
    try:
        write_atomic(rank_file(run_dir, step, rank), data)
    except OSError as e:
        raise UserError(f"cannot write checkpoint {rank_file(run_dir, step, rank)}: "
                        f"{e.strerror or e}") from e
    return hashlib.sha256(data).digest()


def gather_digests(digest: bytes, transport: Transport) -> list[str]:
    """Every worker's digest, in rank order, on every worker."""
    mine = torch.tensor(list(digest), dtype=torch.int64, device=transport.device)
    return [bytes(t.tolist()).hex() for t in transport.all_gather(mine)]


def commit(run_dir: Path, step: int, digests: list[str], keep: int,
           members: list[int] | None = None, workers: int | None = None) -> None:
    """Write the manifest (the checkpoint is complete from then on), then drop all but the
    newest `keep` complete checkpoints, and incomplete ones older than this. `members`: the
    ranks whose `digests` these are, when a run of `workers` shrank (lost ranks get none)."""
    members = list(range(len(digests))) if members is None else members
    by_rank = dict(zip(members, digests))
    workers = workers or len(digests)
    write_atomic(step_dir(run_dir, step) / manifest.NAME, manifest.encoded(
        FORMAT, step, workers, [by_rank.get(r) for r in range(workers)]))
    complete = [s for s in steps(run_dir) if s <= step]
    for old in complete[:-keep] if keep else []:
        shutil.rmtree(step_dir(run_dir, old), ignore_errors=True)
    for folder in (Path(run_dir) / FOLDER).glob("step-*"):
        s = _step_of(folder)
        if s is not None and s < step and not (folder / manifest.NAME).exists():
            shutil.rmtree(folder, ignore_errors=True)


def _step_of(folder: Path) -> int | None:
    try:
        return int(folder.name.removeprefix("step-"))
    except ValueError:
        return None


def steps(run_dir: Path) -> list[int]:
    """Steps of the checkpoints that have a manifest, oldest first."""
    root = Path(run_dir) / FOLDER
    found = [_step_of(f) for f in root.glob("step-*") if (f / manifest.NAME).exists()]
    return sorted(s for s in found if s is not None)


def intact(run_dir: Path, step: int, rank: int, workers: int) -> bytes | None:
    """Worker `rank`'s file of `step`, if the manifest vouches for it; else None, with a
    line on stderr saying what is wrong with the file (of a damaged manifest: agree_step's).
    A worker lost before a checkpoint of a run that shrank starts again from the lowest
    survivor's (allreduce's replicas are alike)."""
    try:
        vouched = manifest.read(step_dir(run_dir, step), step)
    except manifest.Damaged:
        return None
    if vouched["workers"] != workers:  # agree_step says so if no checkpoint fits
        return None
    digests = vouched["sha256"]  # one per worker, one at least not None (manifest.read)
    if digests[rank] is None:
        rank = next(r for r, digest in enumerate(digests) if digest)
    path = rank_file(run_dir, step, rank)
    try:
        data = path.read_bytes()
    except OSError as e:
        _warn(f"checkpoint {path} is unreadable ({e.strerror or e}): using an earlier one")
        return None
    if hashlib.sha256(data).hexdigest() != digests[rank]:
        _warn(f"checkpoint {path} does not match its checksum (corrupt or truncated): "
              "using an earlier one")
        return None
    return data


def _warn(message: str) -> None:
    print(f"fastsgd: {message}", file=sys.stderr, flush=True)


def agree_step(run_dir: Path, transport: Transport,
               required: bool = True) -> tuple[int, bytes] | None:
    """The newest step whose checkpoint every worker holds intact, and this worker's file of
    it (None if there is none and it is not `required`). Each proposes its newest intact
    step no later than the last proposal; the minimum is the next bound, until all propose
    the same."""
    rank, workers = transport.rank, transport.world_size
    candidates = steps(run_dir)[::-1]
    found: dict[int, bytes | None] = {}
    bound = None
    while True:
        mine = -1
        for s in candidates:
            if bound is not None and s > bound:
                continue
            if s not in found:
                found[s] = intact(run_dir, s, rank, workers)
            if found[s] is not None:
                mine = s
                break
        proposals = [int(t) for t in transport.all_gather(
            torch.tensor([mine], dtype=torch.int64, device=transport.device))]
        bound = min(proposals)
        if bound < 0 or all(p == bound for p in proposals):
            break
    passed = [(step_dir(run_dir, s), s) for s in candidates if s > bound]
    for folder, problem in manifest.damaged(passed) if _first_on_node(rank) else []:
        _warn(f"checkpoint {folder} is unreadable ({problem}): using an earlier one")
    if bound < 0:
        _refuse_other_workers(run_dir, transport)
        if not required:
            return None
        raise _none_intact(run_dir, workers, candidates[::-1])
    data = found[bound]
    assert data is not None
    return bound, data


def _first_on_node(rank: int) -> bool:
    """Whether this worker tells what every worker of its node finds alike (a damaged
    manifest): the node's first (LOCAL_RANK 0), or worker 0 of a simulated run."""
    return os.environ.get("LOCAL_RANK", str(rank)) == "0"


def _none_intact(run_dir: Path, workers: int, held: list[int]) -> UserError:
    """The line for a resume that found no checkpoint every worker holds intact: there is
    none (this node holds none), or those there are damaged (said above, one by one)."""
    where = f"no complete checkpoint in {Path(run_dir) / FOLDER} for all {workers} workers"
    if not held:
        return UserError(f"{where} (was run.checkpoint_every 0?)")
    listed = ", ".join(f"step {s}" for s in held)
    return UserError(f"{where}: every checkpoint there ({listed}) is damaged or unreadable")


def workers_of(run_dir: Path) -> int | None:
    """The number of workers of the newest checkpoint with a readable manifest, if any."""
    return manifest.workers_of([(step_dir(run_dir, s), s) for s in steps(run_dir)[::-1]])


def _refuse_other_workers(run_dir: Path, transport: Transport) -> None:
    """When no checkpoint fits every worker: one line if the run's checkpoints are of
    another number of workers (a resume takes the same number; a run that lost workers
    still counts them all). Every worker raises it, or none: each node has its own files."""
    mine = workers_of(run_dir) or transport.world_size
    found = max(int(t) for t in transport.all_gather(torch.tensor(
        [0 if mine == transport.world_size else mine], device=transport.device)))
    if not found:
        return
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun sets the number, not run.workers
        raise UserError(f"{run_dir}'s checkpoints are of {found} workers but torchrun started "
                        f"{transport.world_size}; resume with {found} workers")
    raise UserError(f"{run_dir}'s checkpoints are of {found} workers but run.workers = "
                    f"{transport.world_size}; resume with run.workers = {found}")


def load(data: bytes) -> dict[str, Any]:
    """A worker's checkpoint from its bytes (tensors, numbers, strings: no code)."""
    saved = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    if saved.get("format") != FORMAT:
        raise UserError(f"checkpoint format {saved.get('format')} is not {FORMAT}: written by "
                        "another version of fastsgd")
    return saved


def cut_back(run_dir: Path, step: int) -> None:
    """Drop what a run that died after the checkpoint of `step` logged past it, keeping it
    aside in run_dir/attempts/N/ (N = 1, 2, ...: one folder per cut), so that a restart
    loses no record: a restart from the start moves the whole failed attempt there."""
    aside = None
    for name in ("metrics.jsonl", "eval.jsonl"):
        path = run_dir / name
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        kept, dropped = _split_log(path, text, step)
        if dropped:
            aside = aside or _next_attempt(run_dir)
            write_atomic(aside / name, "".join(dropped).encode())
        if dropped or "".join(kept) != text:
            write_atomic(path, "".join(kept).encode())


def _split_log(path: Path, text: str, step: int) -> tuple[list[str], list[str]]:
    """The lines of a log to keep (step <= `step`, each ending in a newline, for the next
    appends) and those to drop. A crash mid-write leaves a torn last line: it is dropped;
    a line that is not a record anywhere else is damage that the user must look at."""
    kept: list[str] = []
    dropped: list[str] = []
    lines = text.splitlines(keepends=True)
    for n, line in enumerate(lines, 1):
        logged = _logged_step(line)
        if logged is not None:
            line = line if line.endswith("\n") else line + "\n"
            (kept if logged <= step else dropped).append(line)
        elif line.strip() and any(rest.strip() for rest in lines[n:]):
            raise UserError(f"{path}, line {n}, is not a JSON record with a step (the file "
                            "is damaged): repair or delete that line to resume")
        elif line.strip():
            dropped.append(line)
    return kept, dropped


def _logged_step(line: str) -> int | None:
    """The step a metrics.jsonl or eval.jsonl line records; None if it is not a record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    logged = record.get("step") if isinstance(record, dict) else None
    return logged if isinstance(logged, int) and not isinstance(logged, bool) else None


def _next_attempt(run_dir: Path) -> Path:
    """A new folder attempts/N, N the first free (made, not tested: two nodes' leaders
    sharing the run directory may both cut back)."""
    (run_dir / "attempts").mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        try:
            (run_dir / "attempts" / str(n)).mkdir()
            return run_dir / "attempts" / str(n)
        except FileExistsError:
            n += 1
