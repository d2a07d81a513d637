"""Cells as Ray tasks (`fastsgd bench SPEC --ray ADDRESS`): one cell per task, retried if its
worker dies. A task runs the cell in a scratch folder of whichever node Ray chose and
returns the run directory as a tar.gz archive, which the driver unpacks into
BENCH_DIR/cells/ID: no shared filesystem is needed. Every node needs fastsgd and torch
(`pip install "fastsgd[ray]"`), and the datasets the spec names.

Simulated cells with a fixed compute model are deterministic, so a cell's files are the same
bits whichever node ran it; real cells, and simulated ones that measure compute, measure
the node they ran on; those that profile it, the node that ran the first cell of their
workload (profiles.py)."""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from fastsgd.bench.spec import Cell, command
from fastsgd.config import schema as cfg
from fastsgd.errors import UserError

RETRIES = 2  # a task whose worker process or node died is run again this often


def connect(address: str) -> Any:
    """The ray module, connected to `address` ("auto", "HOST:PORT", "ray://HOST:PORT"), or
    to the instance this process already started."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install \"fastsgd[ray]\"") from None
    if not ray.is_initialized():
        _reachable(address)
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"--ray {address}: cannot reach a Ray cluster there ({first})"
                            ) from None
    return ray


def _reachable(address: str, within: float = 5.0) -> None:
    """Fail fast where nothing listens at HOST:PORT (Ray itself retries for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto": Ray looks for a cluster on this machine and says at once
    try:
        socket.create_connection((host, int(port)), timeout=within).close()
    except OSError as e:
        raise UserError(f"--ray {address}: cannot reach a Ray cluster there ({e.strerror or e})"
                        ) from None


def _run_remotely(mode: str, config_toml: str) -> tuple[int, str, bytes]:
    """On a Ray worker: run the cell, return (exit code, its output, the run directory)."""
    with tempfile.TemporaryDirectory(prefix="fastsgd-cell-") as scratch:
        spec, out = Path(scratch) / "cell.toml", Path(scratch) / "run"
        spec.write_text(config_toml)
        proc = subprocess.run(command(mode, spec, out), capture_output=True, text=True)
        archive = io.BytesIO()
        if out.is_dir():
            with tarfile.open(fileobj=archive, mode="w:gz") as tar:
                tar.add(out, arcname=".")
        return proc.returncode, proc.stdout + proc.stderr, archive.getvalue()


def run_cell_on_ray(ray: Any, folder: Path, cell: Cell,
                    config: dict[str, Any] | None = None) -> tuple[int, str]:
    """Run `cell` (with `config`, its own where None) as a Ray task and unpack its run
    directory into `folder`."""
    # a real cell's workers are processes of their own: it reserves a CPU for each
    cpus = cell.config["run"]["workers"] if cell.mode != "simulate" else 1
    task = ray.remote(max_retries=RETRIES, num_cpus=cpus)(_run_remotely)
    code, output, archive = ray.get(task.remote(cell.mode, cfg.to_toml(config or cell.config)))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if archive:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            _extract(tar, folder)
    return code, output


def _extract(tar: tarfile.TarFile, folder: Path) -> None:
    """Unpack plain files and folders only, none outside `folder` (tarfile's "data" filter
    where this Python has it: 3.10.12, 3.11.4 and later)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(folder, filter="data")
        return
    for member in tar.getmembers():
        target = (folder / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not target.is_relative_to(
                folder.resolve()):
            raise UserError(f"a Ray task returned an archive with {member.name!r} in it")
    tar.extractall(folder)
