"""The TCP connections of the messenger (messages.py): one per pair of workers, made through
the job's key-value store."""

from __future__ import annotations

import socket

import torch

from fastsgd.errors import UserError
from fastsgd.transport import frames

HELLO_TAG = -2  # the first frame on a new connection: who it comes from


def connect(rank: int, world_size: int, store, key: str, host: str,
            timeout: float) -> tuple[dict[int, socket.socket], socket.socket]:
    """One connection per pair: each rank listens, publishes its address, connects to the
    ranks above it and accepts those below (in any order: each says who it is first).
    Returns the connections and the listener, which stays open for workers that join later
    (`rejoin`)."""
    socks: dict[int, socket.socket] = {}
    listener = _listen(rank, world_size, store, key, host)
    for peer in range(rank + 1, world_size):
        socks[peer] = _introduce(rank, peer, _reach(rank, peer, *_address(store, key, peer),
                                                    timeout))
    listener.settimeout(timeout)
    while len(socks) < world_size - 1:
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            missing = ", ".join(str(r) for r in range(rank) if r not in socks)
            raise UserError(f"worker {rank}: no message connection from worker {missing} "
                            f"within run.timeout = {timeout:g} s (each worker's message "
                            "port must be reachable: docs/multihost.md)") from None
        peer = _peer_below(sock, rank, socks)
        if peer is not None:
            socks[peer] = sock
    listener.settimeout(None)
    return socks, listener


def _peer_below(sock: socket.socket, rank: int, socks: dict) -> int | None:
    """The rank below `rank` a new connection says it is; None, the connection closed, for a
    stranger (a port scan, a process that was given a port this one once had)."""
    try:
        peer = hello(sock)[0]
    except (OSError, frames.MalformedFrame):
        peer = None
    if peer is None or not 0 <= peer < rank or peer in socks:
        sock.close()
        return None
    return peer


def rejoin(rank: int, world_size: int, store, key: str, host: str, timeout: float,
           since: int = 0) -> tuple[dict[int, socket.socket], socket.socket]:
    """A worker that joins a running job in place of a lost one (rank `rank`), at step
    `since`: it listens and publishes its address (for those who join after it), then
    connects to every peer still listening; a peer that is gone (it refuses, or it resets
    the connection while this one says who it is: it died meanwhile) is left out, and its
    own replacement connects to this worker's listener."""
    listener = _listen(rank, world_size, store, key, host)
    socks = {}
    for peer in range(world_size):
        if peer == rank:
            continue
        try:
            sock = socket.create_connection(_address(store, key, peer), timeout=timeout)
        except OSError:
            continue  # that worker is gone too
        sock.settimeout(None)
        try:
            socks[peer] = _introduce(rank, peer, sock, since)
        except OSError:  # CI: the donor was killed as the joiner said hello
            sock.close()
    return socks, listener


def hello(sock: socket.socket, timeout: float = 30.0) -> tuple[int, int]:
    """The rank a new connection says it comes from (it must say so at once), and the first
    step its process sends for (0, or the step a joiner joins at)."""
    sock.settimeout(timeout)
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
    sock.settimeout(None)
    _tuned(sock)
    return int(words[-1]), frames.step_of(words[:frames.HEADER_WORDS])


def _listen(rank: int, world_size: int, store, key: str, host: str) -> socket.socket:
    listener = socket.create_server(("", 0), backlog=world_size)
    if world_size > 1:
        store.set(f"{key}/{rank}", f"{host}:{listener.getsockname()[1]}")
    return listener


def _address(store, key: str, peer: int) -> tuple[str, int]:
    address, port = store.get(f"{key}/{peer}").decode().rsplit(":", 1)
    return address, int(port)


def _introduce(rank: int, peer: int, sock: socket.socket, since: int = 0) -> socket.socket:
    me = torch.tensor([rank])
    said = frames.header(me, HELLO_TAG, since)
    sock.sendall(bytes(frames.as_bytes(said)) + bytes(frames.as_bytes(me)))
    return _tuned(sock)


def _reach(rank: int, peer: int, address: str, port: int, timeout: float
           ) -> socket.socket:
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
