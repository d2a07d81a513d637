"""Collectives among the workers still alive, over the messenger's TCP connections.

A gloo collective with a dead member fails on the dead's neighbours and leaves the others
waiting until its timeout, and gloo cannot abort one. Workers that carry on without the
dead (`TorchTransport.carry_on`) therefore run their few collectives (evaluation, the final
drain, the summary) as messages: each member sends its tensor to every other member and
sums what it got in rank order, so every member gets the same bits. That sends n-1 copies
where a ring all-reduce sends 2(n-1)/n of one, which is fine for these rare and mostly small
collectives; the bytes counted are those sent. A member lost during a collective is left
out by those that had not yet got its part (the one case where the members' results may
differ: a dead worker cannot finish sending).
"""

from __future__ import annotations

from typing import Protocol

import torch

from fastsgd.transport.base import Handle, PeerLost

FIRST_TAG = -1000  # collective k uses tag FIRST_TAG - k: apart from the strategies' tags


class _Messages(Protocol):
    rank: int

    def members(self) -> list[int]: ...

    def post(self, tensor: torch.Tensor, dst: int, tag: int, droppable: bool = False) -> Handle:
        ...

    def take_from(self, tag: int, src: int) -> torch.Tensor: ...


class Survivors:
    """The collectives of one worker; every member calls them in the same order."""

    def __init__(self, transport: _Messages):
        self.t = transport
        self.calls = 0

    def _tag(self) -> int:
        self.calls += 1
        return FIRST_TAG - self.calls

    def gather(self, tensor: torch.Tensor) -> dict[int, torch.Tensor]:
        """Every member's `tensor`, by rank."""
        tag, rank = self._tag(), self.t.rank
        members = self.t.members()
        for peer in members:
            if peer != rank:
                self.t.post(tensor, peer, tag)
        parts = {rank: tensor}
        for peer in members:
            if peer != rank:
                try:
                    parts[peer] = self.t.take_from(tag, peer).view_as(tensor)
                except PeerLost:
                    continue
        return dict(sorted(parts.items()))

    def all_reduce(self, tensor: torch.Tensor) -> None:
        parts = iter(self.gather(tensor).values())
        total = next(parts).clone()
        for part in parts:  # in rank order on every member: the same bits everywhere
            total += part
        tensor.copy_(total)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return list(self.gather(tensor).values())

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        tag = self._tag()
        if self.t.rank == src:
            for peer in self.t.members():
                if peer != src:
                    self.t.post(tensor, peer, tag)
        else:
            tensor.copy_(self.t.take_from(tag, src).view_as(tensor))

    def barrier(self) -> None:
        self.gather(torch.zeros(0))
