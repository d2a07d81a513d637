"""The TCP connections of the messenger (messages.py): one per pair of workers, made through
the job's key-value store."""

from __future__ import annotations

import socket

import torch

from fastsgd.errors import UserError
from fastsgd.transport import frames

HELLO_TAG = -2  # the first frame on a new connection: who it comes from


def connect(rank: int, world_size: int, store, key: str, host: str,
            timeout: float) -> dict[int, socket.socket]:
    """One connection per pair: each rank listens, publishes its address, connects to the
    ranks above it and accepts those below (in any order: each says who it is first)."""
    socks: dict[int, socket.socket] = {}
    if world_size == 1:
        return socks
    with socket.create_server(("", 0), backlog=world_size) as listener:
        store.set(f"{key}/{rank}", f"{host}:{listener.getsockname()[1]}")
        for peer in range(rank + 1, world_size):
            address, port = store.get(f"{key}/{peer}").decode().rsplit(":", 1)
            sock = _reach(rank, peer, address, int(port), timeout)
            hello = torch.tensor([rank])
            sock.sendall(bytes(frames.as_bytes(frames.header(hello, HELLO_TAG)))
                         + bytes(frames.as_bytes(hello)))
            socks[peer] = _tuned(sock)
        listener.settimeout(timeout)
        while len(socks) < world_size - 1:
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                missing = ", ".join(str(r) for r in range(rank) if r not in socks)
                raise UserError(f"worker {rank}: no message connection from worker {missing} "
                                f"within run.timeout = {timeout:g} s (each worker's message "
                                "port must be reachable: docs/multihost.md)") from None
            sock.settimeout(None)
            socks[_hello(_tuned(sock))] = sock
    return socks


def _reach(rank: int, peer: int, address: str, port: int, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as e:
        raise UserError(f"worker {rank} cannot reach worker {peer}'s message port at "
                        f"{address}:{port} ({e.strerror or type(e).__name__}): it must be "
                        "reachable between the machines (docs/multihost.md)") from None
    sock.settimeout(None)
    return sock


def _tuned(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers do not wait
    return sock


def _hello(sock: socket.socket) -> int:
    """The rank a new connection says it comes from."""
    words = torch.empty(frames.HEADER_WORDS + 1, dtype=torch.int64)
    view = frames.as_bytes(words)
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("a peer closed its connection before saying who it is")
        got += n
    tag, numel, dtype = frames.parse(words[:frames.HEADER_WORDS], -1)
    if tag != HELLO_TAG or numel != 1 or dtype != torch.int64:
        raise frames.MalformedFrame("a connection to this worker did not start with a hello")
    return int(words[-1])
