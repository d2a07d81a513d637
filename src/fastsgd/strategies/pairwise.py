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
  Nobody waits for an exchange; a worker waits only when it is `max_lag` steps ahead of
  what a neighbour last said of itself (a word every max_lag / 2 steps), as SGP bounds
  its overlap (Assran et al. 2019): unbounded, real processes ran hundreds of steps apart.

It drains at the last step: every answer still on the wire is taken in. Then, with
`average_at_end` (the default), one all-reduce replaces every replica by the average, so the
run ends in consensus like the synchronous strategies; `false` keeps each replica's own
model, to study how far apart they end.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

from fastsgd.config.options import Option, at_least
from fastsgd.errors import UserError
from fastsgd.strategies.async_averages import (
    pair_answer,
    pair_answered,
    pair_request,
    sent_copy,
    taken_copy,
)
from fastsgd.strategies.base import Context
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.gossip import (
    END_OPTIONS,
    TOPOLOGY_OPTIONS,
    OnGraph,
    edge_copy,
)
from fastsgd.strategies.params import assign, flatten
from fastsgd.transport.base import PeerLost

Params = list[torch.nn.Parameter]
PAIR = 22  # message tag (sgp's PUSH is 21)
REQUEST, ANSWER, STEP = 0, 1, 2  # the first byte of a PAIR message
MAX_LAG = 16  # steps a worker may run ahead of its neighbours (max_lag)


class ADPSGD(OnGraph):
    name = "adpsgd"
    capabilities = Capabilities(
        drains_at_end=True,  # answers and collects every exchange still out (ctx.last_step)
        async_drain=True,  # the slowest's included
        codec_kinds=("exact", "quantize", "sparse"),
        carries_on=("exact", "quantize", "sparse"),  # an exchange with a lost peer is given up
        carries_on_real=True,  # also on real processes: no collective while training
        rejoins=("exact", "quantize", "sparse"))  # a new worker may take a lost one's place
    OPTIONS = {**TOPOLOGY_OPTIONS,
               "rotate": Option(bool, False, doc="rotate partners (GossipGraD)"),
               "max_lag": Option(int, MAX_LAG, at_least(0), "at step k, first wait until "
                                 "every neighbour is known to be at step k - max_lag "
                                 "(0: never wait)"), **END_OPTIONS}

    def __init__(self, rotate: bool = False, max_lag: int = MAX_LAG,
                 average_at_end: bool = True, **graph: Any):
        super().__init__(**graph)
        self.rotate, self.max_lag, self.average_at_end = rotate, max_lag, average_at_end

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
        self._rank = ctx.transport.rank
        self._rng = random.Random(self._rank)
        # each process standing for a rank is known by the step it joined at (run.rejoin):
        # requests and words of where a worker is (STEP) are counted per process at both
        # ends, so that the final drain waits only for those the processes there now sent
        self._since = 0  # the step this process joined at (0: it started with the run)
        self._asked: dict[tuple[int, int], int] = {}  # (rank, its process): requests, STEPs
        self._answered: dict[tuple[int, int], int] = {}  # (sender, its process): taken in
        self._waiting_on: tuple[int, int] | None = None  # whose answer is due to this worker
        self._heard: dict[int, int] = {}  # per neighbour: the latest step it is known at
        self._floor: int | None = 0  # no wait for steps before this (max_lag)
        if self._codec.kind == "exact":  # no copies to keep
            return {"copies": {}}
        # every replica starts here: the pairs' copies of the requesters begin as this
        return {"start": flatten(params), "copies": {}}

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        t = ctx.transport
        x = flatten(params)
        self._forget_lost(t)
        lags = [0]  # how many steps ago each request taken in now was sent
        for src, m in t.poll(PAIR):
            x = self._take(t, src, m, x, state, ctx.step, lags)
        if self.max_lag and (ctx.step % self._every == 0 or ctx.last_step):
            for peer in self._neighbours(t, ctx.step):  # where this worker is, before it waits
                t.post(_tagged(STEP, self._since, ctx.step, ctx.step, x.new_empty(0,
                       dtype=torch.uint8)), peer, PAIR)
                self._count(t, peer, ctx.step)
        if self.max_lag and not ctx.last_step:
            x = self._await_lagging(t, ctx.step, x, state, lags)
        ctx.stats["staleness"] = max(lags)
        if ctx.last_step:
            x = self._drain(t, x, state, ctx.step)
            if self.average_at_end:
                x = x.clone()
                t.all_reduce(x, average=True)
        elif t.rank % 2 == 0 and self._waiting_on is None and self._partners(t, ctx.step):
            self._request(t, self._partner(t, ctx.step), x, state, ctx.step)
        assign(params, x)

    def _request(self, t, peer: int, x: torch.Tensor, state: dict[str, Any], step: int) -> None:
        copy = None  # the exact codec: x itself, no copy to keep
        if self._codec.kind != "exact":
            pair = (peer, t.returned_at(peer, step))
            copy = sent_copy(t, state, "copies", pair, self._since, x)
        payload = pair_request(self._codec, x, copy, t.rank)
        t.post(_tagged(REQUEST, self._since, step, step, payload), peer, PAIR)
        self._waiting_on = self._count(t, peer, step)

    def _count(self, t, peer: int, step: int) -> tuple[int, int]:
        """One more message `peer`'s process of now must take in before the end."""
        process = (peer, t.returned_at(peer, step))
        self._asked[process] = self._asked.get(process, 0) + 1
        return process

    def settle(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        """Before a checkpoint (every worker): answer every request and take every answer,
        as at the end."""
        assign(params, self._drain(ctx.transport, flatten(params), state, ctx.step))

    def in_flight_state(self) -> dict[str, Any]:
        return {"asked": _rows(self._asked), "answered": _rows(self._answered),
                "rng": self._rng.getstate(), "since": self._since}

    def load_in_flight(self, saved: dict[str, Any]) -> None:
        self._asked, self._answered = _counts(saved["asked"]), _counts(saved["answered"])
        self._rng.setstate(saved["rng"])
        self._since = int(saved.get("since", 0))
        self._heard, self._floor = {}, None  # from the step it resumes at

    def donate(self, state: dict[str, Any]) -> dict[str, Any]:
        """A worker joins in a lost one's place from this one's state (run.rejoin): the
        pairs' copies are this worker's, the joiner's pairs start afresh."""
        return {**state, "copies": {}}

    def joined(self, step: int, params: Params) -> None:
        """This process took a lost worker's place at `step`, from another's state
        (run.rejoin): no exchange of its own is out, and it draws its own partners."""
        self._since, self._asked, self._answered, self._waiting_on = step, {}, {}, None
        self._heard, self._floor = {}, step
        self._rng = random.Random(self._rank * 1_000_003 + step)

    def _forget_lost(self, t) -> None:
        """The process asked is lost, or another has taken its place (run.rejoin): its
        answer will never come."""
        if self._waiting_on is not None:
            peer, since = self._waiting_on
            if peer in t.departed() or t.returned_at(peer, sys.maxsize) != since:
                self._waiting_on = None

    def _take(self, t, src: int, m: torch.Tensor, x: torch.Tensor, state: dict[str, Any],
              step: int, lags: list[int]) -> torch.Tensor:
        """A request: update the requester's copy, answer with d and add it. An answer:
        subtract d (answers from one peer come in the order of the requests, and a requester
        has one exchange out at a time, so both ends update the copy in the same order).
        `lags` gets how many steps ago the request was sent."""
        codec, (kind, since, asked_at, at, payload) = self._codec, _untagged(m)
        self._heard[src] = max(self._heard.get(src, -1), at)
        if kind == STEP:
            self._answered[src, since] = self._answered.get((src, since), 0) + 1
            return x
        lossy = codec.kind != "exact"  # a copy per pair of processes (gossip.edge_copy)
        if kind == REQUEST:
            copy = taken_copy(t, state, "copies", (src, since), self._since) if lossy else None
            answer, d = pair_answer(codec, payload, x, copy, src, t.rank)
            t.post(_tagged(ANSWER, since, asked_at, step, answer), src, PAIR)  # to the asker
            self._answered[src, since] = self._answered.get((src, since), 0) + 1
            lags.append(step - asked_at)
            return x + d
        if self._waiting_on is None or src != self._waiting_on[0] or since != self._since:
            return x  # the answer of an exchange given up (this worker thought src lost)
        copy = edge_copy(state, "copies", self._waiting_on) if lossy else None
        self._waiting_on = None
        lags.append(step - asked_at)
        return pair_answered(codec, payload, x, copy, src)

    def _drain(self, t, x: torch.Tensor, state: dict[str, Any], step: int) -> torch.Tensor:
        """Collective: answer every request still coming from a live peer's process of
        now and collect every answer due."""
        mine = [self._asked.get((r, t.returned_at(r, step)), 0) for r in range(t.world_size)]
        asked = torch.tensor(mine, dtype=torch.float64, device=x.device)
        t.all_reduce(asked)  # among the survivors: a lost worker's requests are not waited for
        while True:
            self._forget_lost(t)
            gone = t.departed()
            answered = sum(n for (r, since), n in self._answered.items()
                           if r not in gone and since == t.returned_at(r, step))
            if answered >= int(asked[t.rank]) and self._waiting_on is None:
                return x
            try:
                src, m = t.wait_message(PAIR)
            except PeerLost:
                continue
            x = self._take(t, src, m, x, state, step, [])

    @property
    def _every(self) -> int:
        """Steps between a worker's words of where it is (max_lag)."""
        return max(1, self.max_lag // 2)

    def _neighbours(self, t, step: int) -> list[int]:
        assert self.topology is not None
        gone = t.absent(step) | set(t.departed())
        near = set(self.topology.out_neighbors(t.rank, step))
        near |= set(self.topology.in_neighbors(t.rank, step))
        return sorted(p for p in near if p != t.rank and p not in gone)

    def _await_lagging(self, t, step: int, x: torch.Tensor, state: dict[str, Any],
                       lags: list[int]) -> torch.Tensor:
        """Wait, answering and taking what comes meanwhile, until every neighbour still
        there is known to be at step - max_lag: a bound on how far apart in steps the
        replicas run. Unbounded, 4 real processes of the MLP ran 100-200 steps apart, the
        slowest trained alone at the end and diverged, and the final average scored 10-55%
        (1-2% in the simulator's equal-speed runs). Every worker says where it is every
        max_lag / 2 steps, before it waits, so the slowest never waits."""
        if self._floor is None:
            self._floor = step
        lagging = step - self.max_lag
        while lagging >= self._floor:
            if all(self._heard.get(p, -1) >= lagging for p in self._neighbours(t, lagging)):
                break
            try:
                src, m = t.wait_message(PAIR)
            except PeerLost:
                continue  # counted out: asked again
            x = self._take(t, src, m, x, state, step, lags)
        return x

    def _partners(self, t, step: int) -> list[int]:
        """The odd neighbours this even rank may ask at `step`, those lost and not back
        left out."""
        assert self.topology is not None
        gone = t.absent(step) | set(t.departed())
        return [p for p in self.topology.out_neighbors(t.rank, step) if p % 2 and p not in gone]

    def _partner(self, t, step: int) -> int:
        peers = self._partners(t, step)
        return peers[step % len(peers)] if self.rotate else self._rng.choice(peers)


def _tagged(kind: int, since: int, asked_at: int, at: int,
            payload: torch.Tensor) -> torch.Tensor:
    """A PAIR message: its kind, the step the requester's process joined at and the step it
    asked at (an answer echoes both), the step its sender is at, the payload."""
    header = torch.tensor([since, asked_at, at], dtype=torch.int64).view(torch.uint8)
    return torch.cat([payload.new_tensor([kind]), header.to(payload.device), payload])


def _untagged(m: torch.Tensor) -> tuple[int, int, int, int, torch.Tensor]:
    since, asked_at, at = m[1:25].cpu().clone().view(torch.int64).tolist()
    return int(m[0]), since, asked_at, at, m[25:]


def _rows(counts: dict[tuple[int, int], int]) -> list[list[int]]:
    return [[rank, since, n] for (rank, since), n in sorted(counts.items())]


def _counts(rows: list) -> dict[tuple[int, int], int]:
    """The counts `_rows` wrote, or a checkpoint's from before rejoins (one per rank)."""
    if rows and not isinstance(rows[0], (list, tuple)):
        return {(rank, 0): int(n) for rank, n in enumerate(rows) if n}
    return {(int(rank), int(since)): int(n) for rank, since, n in rows}
