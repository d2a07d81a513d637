"""Joining a torch.distributed job: the backend, the rendezvous (one line when it fails),
the address peers reach this worker at; and telling a dead peer from other errors."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import tempfile
from collections.abc import Iterator

import torch
import torch.distributed as dist

from fastsgd.errors import UserError


def pick_backend(backend: str = "auto", local: int | None = None) -> str:
    """`auto` is NCCL when every worker on this machine (`local`, else LOCAL_WORLD_SIZE) has
    a GPU of its own (NCCL refuses two ranks on one GPU), else gloo. The GPUs are counted
    through NVML, which, unlike torch.cuda.is_available(), leaves CUDA usable in processes
    forked afterwards (the launcher asks before it forks its workers)."""
    gpus = torch.cuda.device_count()
    local = local or int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if backend == "auto":
        return "nccl" if dist.is_nccl_available() and 0 < local <= gpus else "gloo"
    if backend == "nccl" and local > gpus:
        have = "no GPU is visible" if gpus == 0 else f"this machine has {gpus}"
        raise UserError(f"run.backend = 'nccl' needs a GPU for each of the {local} workers "
                        f"on this machine, and {have} (use run.backend = 'gloo')")
    return backend


def rendezvous(backend: str, timeout: float) -> None:
    """init_process_group, with one line naming the port or the address when it fails
    (c10d also logs the failure, with a C++ backtrace, on stderr: that is held back and
    shown only if the rendezvous succeeds)."""
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        with stderr_held():
            dist.init_process_group(backend, init_method="env://",
                                    timeout=datetime.timedelta(seconds=timeout))
    except dist.DistNetworkError as e:
        reason = str(e).splitlines()[0]
        if "EADDRINUSE" in reason:
            raise UserError(f"the rendezvous port {os.environ['MASTER_PORT']} "
                            f"(MASTER_PORT) is busy on {os.environ['MASTER_ADDR']}: another "
                            "job holds it; choose another port") from None
        raise UserError(f"cannot reach the rendezvous at {where} (MASTER_ADDR:MASTER_PORT) "
                        f"within run.timeout = {timeout:g} s: {reason}") from None


def joining_store(timeout: float) -> dist.Store:
    """The job's store as the workers' default group sees it, for a worker that joins a
    running job (it takes no part in the rendezvous: the others' group is formed already).
    init_process_group keeps its keys under "default_pg", then the group's name ("0")."""
    raw = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                        is_master=False, timeout=datetime.timedelta(seconds=min(timeout, 30)))
    return dist.PrefixStore("0/", dist.PrefixStore("default_pg", raw))


@contextlib.contextmanager
def stderr_held() -> Iterator[None]:
    """File descriptor 2 goes to a temporary file (C++ writes there too) for the block;
    what was written is shown afterwards if the block succeeds, dropped if it raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        sys.stderr.write(held.read())


def address_towards(master: str) -> str:
    """This host's address on the interface that leads to the rendezvous host (where the
    peers can reach it; 127.0.0.1 for a local job)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master, 9))  # a datagram socket sends nothing on connect
        return probe.getsockname()[0]


PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


class PeerGone(RuntimeError):
    """The messenger's connection to a peer ended without a goodbye: the peer died."""


def peer_gone(error: BaseException) -> bool:
    """Is this gloo or the messenger telling that a peer process vanished (killed, crashed)?"""
    return isinstance(error, PeerGone) or (
        isinstance(error, RuntimeError) and any(s in str(error) for s in PEER_GONE))
