"""Where a run writes, and the environment it records: a run never overwrites another.

A run writes into `run.out`, or `runs/STRATEGY-TIME` when that is empty. If the folder
already holds a run, the new one goes to `NAME-2`, `NAME-3`..., unless the user named the
folder themselves (`--set run.out=...`, or `run.out` in the API's options) or asked to
overwrite: then the old run's files are removed first. `--resume` continues a run in its
own folder, keeping its files. Under torchrun rank 0 decides and
the other ranks follow, so every node writes to the same path.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any

import torch

from fastsgd.config import VERSION
from fastsgd.errors import UserError
from fastsgd.records.metrics import FAILURES
from fastsgd.records.tensorboard import PREFIX as EVENTS_PREFIX
from fastsgd.records.tensorboard import SUFFIX as EVENTS_SUFFIX

DOOR = ".door"  # while a run with run.join runs: its launcher's shared state (door.py)
# made with O_EXCL when a run claims a folder: of two runs started in one second, or two
# claiming a folder made by hand, only one gets it (a folder is taken before any file of
# the run is written in it)
CLAIMED = ".claimed"
_HELD: dict[Path, int] = {}  # run directories this process holds (hold): their locks' fds
RUN_FILES = (CLAIMED, DOOR, "config.toml", "environment.json", "metrics.jsonl", "eval.jsonl",
             "summary.json", "model.pt", FAILURES)
_NAME_BYTES = 4096


def default_out(strategy: str, when: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return f"runs/{strategy}-{stamp}"


def claim(out: str, reuse: bool, resume: bool = False, writer: bool = True) -> Path:
    """The run directory for `out`, created: `out` itself if it holds no run or `reuse` is
    set (its old run's files and checkpoints are then removed), else the first free `out-K`.
    `resume`: `out` as it is, which must exist; `reuse` and `resume` both: `out` as it is,
    created if need be. This process then holds it (`hold`), unless it resumes as no
    `writer`: a worker that joins the run holding it (fastsgd join)."""
    path = Path(out)
    if resume and not reuse:
        if not path.is_dir():
            raise UserError(f"cannot resume {path}: no such run directory")
        if writer:  # else a worker joining the run that holds it (fastsgd join)
            hold(path)
        return path
    if reuse and resume:
        make_run_folder(path, out, exist_ok=True)
        if writer:
            hold(path)
        return path
    if reuse:
        make_run_folder(path, out, exist_ok=True)
        hold(path)  # before anything of the run that may be writing there is removed
        for name in RUN_FILES:
            if name != CLAIMED:
                (path / name).unlink(missing_ok=True)
        shutil.rmtree(path / "checkpoints", ignore_errors=True)
        shutil.rmtree(path / "report", ignore_errors=True)
        shutil.rmtree(path / "attempts", ignore_errors=True)
        for events in path.glob(f"{EVENTS_PREFIX}*{EVENTS_SUFFIX}"):
            events.unlink()
        return path
    for k in count(1):
        candidate = path if k == 1 else path.with_name(f"{path.name}-{k}")
        try:
            make_run_folder(candidate, out)
        except FileExistsError:  # a folder (or a file) of that name: the next name, unless
            if not candidate.is_dir() or holds_run(candidate):  # it is empty, made by hand
                continue
        if _claimed(candidate):
            hold(candidate)
            return candidate
    raise AssertionError("unreachable")


def hold(path: Path) -> None:
    """Lock the run directory `path` for this run (flock on its CLAIMED file, which holds the
    writer's pid; forked workers keep it while they live), until `release` or the end of
    this process: a second writer (a resume, or a run with the same run.out, while it runs)
    is refused in one line naming the holder."""
    try:
        fd = os.open(path / CLAIMED, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # a read-only file system, a folder of another user's
        raise UserError(f"{path}: cannot write in it ({e.strerror}); a run needs a folder "
                        "it can write, give it another run.out (or copy the run there to "
                        "resume it)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UserError(f"{path} is in use by a running fastsgd (process {holder}): wait for "
                        "it to end or stop it, or give this run another run.out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[path.resolve()] = fd


def release(path: Path) -> None:
    """Unlock the run directory `path` (see `hold`); nothing if this process does not hold it."""
    fd = _HELD.pop(path.resolve(), None)
    if fd is not None:
        os.close(fd)


def _claimed(folder: Path) -> bool:
    """Whether this process took `folder`: the first to make its CLAIMED file."""
    try:
        os.close(os.open(folder / CLAIMED, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def make_run_folder(path: Path, out: str, exist_ok: bool = False) -> None:
    """Make the run folder `path`, or one line naming run.out and why not (FileExistsError
    as mkdir raises it, unless `exist_ok`)."""
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        if not exist_ok:
            raise
        raise UserError(f"run.out = '{out}': {path} is a file, not a folder") from None
    except OSError as e:
        raise UserError(f"run.out = '{out}': cannot make the folder {path} "
                        f"({e.strerror})") from None


@contextmanager
def dropped_if_empty(path: Path, named_by_us: bool) -> Iterator[None]:
    """A run that fails before it wrote anything (bad input found by a worker, say) leaves
    no empty folder behind, if fastsgd named it (runs/STRATEGY-TIME); a folder the user
    named stays. Either way the run's lock on it is released at the end."""
    try:
        yield
    except BaseException:
        if named_by_us and path.is_dir() and {p.name for p in path.iterdir()} <= {CLAIMED}:
            (path / CLAIMED).unlink(missing_ok=True)
            path.rmdir()
        raise
    finally:
        release(path)


def holds_run(path: Path) -> bool:
    return any((path / name).exists() for name in RUN_FILES)


def agree(text: str, transport: Any) -> str:
    """Rank 0's `text` on every rank (one broadcast of a fixed-size byte tensor)."""
    data = text.encode()[:_NAME_BYTES] if transport.rank == 0 else b""
    buffer = torch.zeros(_NAME_BYTES + 2, dtype=torch.uint8)
    buffer[:2] = torch.tensor([len(data) // 256, len(data) % 256], dtype=torch.uint8)
    buffer[2:2 + len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    buffer = buffer.to(transport.device)
    transport.broadcast(buffer, 0)
    raw = bytes(buffer.cpu().tolist())
    return raw[2:2 + raw[0] * 256 + raw[1]].decode()


def host_names(transport: Any) -> list[str]:
    """Every rank's host name, in rank order (one all-gather)."""
    mine = socket.gethostname().encode()[:254]
    buffer = torch.zeros(256, dtype=torch.uint8)
    buffer[0] = len(mine)
    buffer[1:1 + len(mine)] = torch.tensor(list(mine), dtype=torch.uint8)
    gathered = transport.all_gather(buffer.to(transport.device))
    return [bytes(b.cpu().tolist()[1:1 + int(b[0])]).decode() for b in gathered]


def environment(backend: str, hosts: list[str]) -> dict[str, Any]:
    """What ran where: versions, the git commits of the working directory and of fastsgd's
    source (when they are checkouts), the backend, each rank's host, and rank 0's CPU (runs
    repeat bit for bit on one CPU model, not across models). On real processes also rank
    0's TCP congestion control, which moves the time of gossip over slow links by ~10%
    (docs/multihost.md)."""
    recorded = {
        "fastsgd": VERSION, "torch": torch.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "command": sys.argv, "cwd_git_commit": git_commit(Path.cwd()),
        "fastsgd_git_commit": git_commit(Path(__file__).parents[1]),
        "backend": backend, "cuda": torch.version.cuda, "hosts": hosts,
        "cpu": cpu_name(), "cpu_count": os.cpu_count(),
    }
    if backend != "simulated":
        recorded["tcp_congestion_control"] = _read(CONGESTION_CONTROL)
    return recorded


CONGESTION_CONTROL = "/proc/sys/net/ipv4/tcp_congestion_control"


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else what `platform` knows)."""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def git_commit(folder: Path) -> str | None:
    """HEAD of the repository holding `folder` ('+dirty' with uncommitted changes), or None."""
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")
