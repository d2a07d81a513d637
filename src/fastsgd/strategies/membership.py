"""Carrying on without lost workers: who is gone, how a graph closes around the gap, and
waiting for messages while peers may leave.

A worker that left at step k (transport.departed()) took part in steps 0..k-1 only, so the
graph of step s drops the workers that left at or before s. Only a lost worker's
neighbours see their edges change, and they are exactly the workers that wait for its
messages of step k; they learn of the loss when the wait fails (PeerLost), so nobody else
needs to know at once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch

from fastsgd.strategies.capabilities import capabilities_of
from fastsgd.topology.build import Topology
from fastsgd.transport.base import PeerLost, Transport


def carries_on_for_real(strategy: object, codec: object) -> bool:
    """Do real worker processes of this strategy carry on without a dead one? Those that
    wait for no collective while training (capabilities.carries_on_real), with a codec whose
    state does not tie the dead to the living (capabilities.carries_on)."""
    capabilities = capabilities_of(strategy)
    return (capabilities.carries_on_real
            and getattr(codec, "kind", "exact") in capabilities.carries_on)


def shrinks_for_real(strategy: object, codec: object) -> bool:
    """Do real worker processes of this synchronous strategy go on in a smaller group without
    a dead one (capabilities.shrinks_real: run.on_failure = "shrink", recovery.py), with this
    codec (capabilities.carries_on)?"""
    capabilities = capabilities_of(strategy)
    return (capabilities.shrinks_real
            and getattr(codec, "kind", "exact") in capabilities.carries_on)


def first_expendable(strategy: object) -> int:
    """The lowest rank the others can carry on without: a parameter server's ranks hold
    shards nobody else has (the results are written by the lowest survivor, worker.py)."""
    if getattr(strategy, "name", "") == "ps":
        return max(1, getattr(strategy, "servers", 1))
    return 0


def gone_at(transport: Transport, step: int) -> set[int]:
    """The ranks that take no part in `step` (left at or before it, and not back)."""
    return transport.absent(step)


def healed_weights(topology: Topology, rank: int, step: int,
                   gone: set[int]) -> list[tuple[int, float]]:
    """Row `rank` of the mixing matrix at `step` without the workers in `gone`.

    On a ring, and along each row and column of a torus, the graph closes around the gap:
    an edge to a lost worker is moved, with its weight, to the next live worker further
    in the same direction (each end of the new edge moves the weight it had, and they had
    the same). On other graphs the edge's weight goes back to the worker itself. Either way
    W stays symmetric where it was, so a doubly stochastic W stays doubly stochastic and
    gossip still preserves the average of the survivors."""
    weights = topology.weights(rank, step)
    if not gone.intersection(p for p, _ in weights):
        return weights
    row: dict[int, float] = defaultdict(float)
    for peer, weight in weights:
        row[peer if peer not in gone else _bridge(topology, rank, peer, gone)] += weight
    return sorted(row.items())


def _bridge(topology: Topology, rank: int, lost: int, gone: set[int]) -> int:
    """The next live worker past `lost`, seen from `rank` along their ring (or torus row or
    column); `rank` itself where there is none, or on other graphs."""
    n = topology.n
    if topology.name == "ring":
        size, index, at = n, lambda r: r, lambda i: i
    elif topology.name == "torus" and rank // topology.cols == lost // topology.cols:
        row, size = rank // topology.cols, topology.cols
        index, at = (lambda r: r % topology.cols), (lambda i: row * topology.cols + i)
    elif topology.name == "torus":
        col, size = rank % topology.cols, topology.rows
        index, at = (lambda r: r // topology.cols), (lambda i: i * topology.cols + col)
    else:
        return rank
    step = 1 if (index(lost) - index(rank)) % size == 1 else -1
    position = index(lost)
    while at(position) in gone:
        position = (position + step) % size
    return at(position)


def await_messages(transport: Transport, tag: int,
                   due: Callable[[], int]) -> list[tuple[int, torch.Tensor]]:
    """Wait for `due()` messages with `tag`; `due` is asked again only when a peer is found
    lost meanwhile (it may no longer be sending): it may be costly (sgp's counts every step
    of the run), and asked after every message it made a drain of n messages after many
    rejoins take n times that (minutes: a soak's run seemed to hang at its end)."""
    arrived: list[tuple[int, torch.Tensor]] = []
    wanted = due()
    while len(arrived) < wanted:
        try:
            arrived.append(transport.wait_message(tag))
        except PeerLost:
            wanted = due()
    return arrived
