"""Asynchronous pairwise gossip: nobody waits for the slowest worker.

- `adpsgd`: asynchronous pairwise gossip (AD-PSGD, Lian et al. 2018): after each step a
  worker sends its parameters to one neighbour; the neighbour, when it next looks, replaces
  its own by the average and answers with it; when the answer comes, the first worker puts
  the average in place of the snapshot it sent, keeping the progress it made since. So the
  pair's sum is exactly preserved and no gradient step is lost, without anyone waiting. As
  in the paper, only even ranks start exchanges, with odd neighbours: two requests that
  cross would swap the models instead of averaging them, and an even rank starts a new
  exchange only once the last one has been answered (overlapping exchanges would add up the
  same snapshot several times and push the replicas apart).
  `rotate = true` walks the neighbours in turn (GossipGraD's rotating partners, Daily et al.
  2018) instead of drawing one at random. On the wire: two parameter vectors per exchange.
  An exchange moves differences, so that it can be compressed: each pair keeps a copy of
  the requester's parameters that both ends update alike (as CHOCO-gossip does, Koloskova et
  al. 2019); a request carries the change since that copy, the answer carries d, half the way
  from the answerer to the copy, and the answerer adds d while the requester subtracts it.
  The pair's sum is preserved exactly whatever the codec loses; with `none` the request
  carries the parameters themselves (no copies) and the exchange is the plain average.

It drains at the last step: every answer still on the wire is taken in. Then, with
`average_at_end` (the default), one all-reduce replaces every replica by the average, so the
run ends in consensus like the synchronous strategies; `false` keeps each replica's own
model, to study how far apart they end.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from fastsgd.compress.collectives import decode_buffer
from fastsgd.compress.wire import pack
from fastsgd.errors import UserError
from fastsgd.options import Option
from fastsgd.strategies.base import Context
from fastsgd.strategies.gossip import END_OPTIONS, TOPOLOGY_OPTIONS, _OnGraph, edge_copy
from fastsgd.strategies.params import assign, flatten
from fastsgd.transport.base import PeerLost

Params = list[torch.nn.Parameter]
PAIR = 22  # message tag (sgp's PUSH is 21)
REQUEST, ANSWER = 0, 1  # the first byte of a PAIR message


class ADPSGD(_OnGraph):
    name = "adpsgd"
    DRAINS_AT_END = True  # answers and collects every exchange still out (ctx.last_step)
    CODEC_KINDS = ("exact", "quantize", "sparse")
    CARRIES_ON = CODEC_KINDS  # an exchange with a lost peer is given up
    CARRIES_ON_REAL = True  # also on real processes: no collective while training
    OPTIONS = {**TOPOLOGY_OPTIONS,
               "rotate": Option(bool, False, doc="rotate partners (GossipGraD)"), **END_OPTIONS}

    def __init__(self, rotate: bool = False, average_at_end: bool = True, **graph: Any):
        super().__init__(**graph)
        self.rotate, self.average_at_end = rotate, average_at_end

    def check(self, world_size: int) -> None:
        topology = self.build(world_size)
        for rank in range(0, world_size if world_size > 1 else 0, 2):
            if not [p for p in topology.out_neighbors(rank) if p % 2]:
                raise UserError(f"adpsgd: worker {rank} has no odd-rank neighbour in the "
                                f"{topology.name} topology (strategy.topology); even ranks "
                                "start exchanges with odd ones")

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        self.check(ctx.transport.world_size)
        super().init(params, ctx)
        ctx.transport.start_messages()
        self._codec = ctx.compressor
        self._rng = random.Random(ctx.transport.rank)
        self._asked = [0] * ctx.transport.world_size  # requests sent to each rank
        self._waiting_on: int | None = None  # the peer whose answer is due to this worker
        self._answered = [0] * ctx.transport.world_size  # requests answered, by requester
        if self._codec.kind == "exact":  # no copies to keep
            return {"copies": {}}
        # every replica starts here: the pairs' copies of the requesters begin as this
        return {"start": flatten(params), "copies": {}}

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        t = ctx.transport
        x = flatten(params)
        if self._waiting_on in t.departed():
            self._waiting_on = None  # lost: its answer will never come
        for src, m in t.poll(PAIR):
            x = self._take(t, src, m, x, state)
        if ctx.last_step:
            x = self._drain(t, x, state)
            if self.average_at_end:
                x = x.clone()
                t.all_reduce(x)
                x /= len(t.members())
        elif t.rank % 2 == 0 and self._waiting_on is None and self._partners(t, ctx.step):
            peer = self._partner(t, ctx.step)
            if self._codec.kind == "exact":  # x itself: no copy to keep
                payload = pack(self._codec.compress(x))
            else:
                copy = edge_copy(state, "copies", peer)
                payload = pack(self._codec.compress(x - copy))
                copy += decode_buffer(self._codec, payload, x, t.rank)
            t.post(_tagged(REQUEST, payload), peer, PAIR)
            self._asked[peer] += 1
            self._waiting_on = peer
        assign(params, x)

    def settle(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        """Before a checkpoint (every worker): answer every request and take every answer,
        as at the end."""
        assign(params, self._drain(ctx.transport, flatten(params), state))

    def in_flight_state(self) -> dict[str, Any]:
        return {"asked": list(self._asked), "answered": list(self._answered),
                "rng": self._rng.getstate()}

    def load_in_flight(self, saved: dict[str, Any]) -> None:
        self._asked, self._answered = list(saved["asked"]), list(saved["answered"])
        self._rng.setstate(saved["rng"])

    def _take(self, t, src: int, m: torch.Tensor, x: torch.Tensor,
              state: dict[str, Any]) -> torch.Tensor:
        """A request: update the requester's copy, answer with d and add it. An answer:
        subtract d (answers from one peer come in the order of the requests, and a requester
        has one exchange out at a time, so both ends update the copy in the same order)."""
        codec, payload = self._codec, m[1:]
        copy = None if codec.kind == "exact" else edge_copy(state, "copies", src)
        if int(m[0]) == REQUEST:
            theirs = decode_buffer(codec, payload, x, src)
            if copy is not None:
                theirs = copy.add_(theirs)
            answer = pack(codec.compress((theirs - x) / 2))
            d = decode_buffer(codec, answer, x, t.rank)
            if copy is not None:
                copy -= d
            t.post(_tagged(ANSWER, answer), src, PAIR)
            self._answered[src] += 1
            return x + d
        if src != self._waiting_on:
            return x  # the answer of an exchange given up (this worker thought src lost)
        self._waiting_on = None
        d = decode_buffer(codec, payload, x, src)
        if copy is not None:
            copy -= d
        return x - d

    def _drain(self, t, x: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        """Collective: answer every request still coming from a live peer and collect
        every answer due."""
        asked = torch.tensor(self._asked, dtype=torch.float64, device=x.device)
        t.all_reduce(asked)  # among the survivors: a lost worker's requests are not waited for
        while True:
            gone = t.departed()
            if self._waiting_on in gone:
                self._waiting_on = None
            answered = sum(n for r, n in enumerate(self._answered) if r not in gone)
            if answered >= int(asked[t.rank]) and self._waiting_on is None:
                return x
            try:
                src, m = t.wait_message(PAIR)
            except PeerLost:
                continue
            x = self._take(t, src, m, x, state)

    def _partners(self, t, step: int) -> list[int]:
        """The odd neighbours this even rank may ask at `step`, lost ones left out."""
        assert self.topology is not None
        gone = t.departed()
        return [p for p in self.topology.out_neighbors(t.rank, step) if p % 2 and p not in gone]

    def _partner(self, t, step: int) -> int:
        peers = self._partners(t, step)
        return peers[step % len(peers)] if self.rotate else self._rng.choice(peers)


def _tagged(kind: int, payload: torch.Tensor) -> torch.Tensor:
    return torch.cat([payload.new_tensor([kind]), payload])
