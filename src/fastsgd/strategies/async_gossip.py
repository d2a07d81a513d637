"""Asynchronous decentralized strategies: nobody waits for the slowest worker.

- `sgp`: stochastic gradient push (Assran et al. 2019): push-sum on directed, time-varying
  graphs (default: the one-peer exponential graph). Each worker keeps a numerator x and a
  weight w, trains the de-biased z = x / w, and after each step pushes equal shares of
  (x, w) to its out-neighbours, then adds in whatever shares have arrived, without waiting.
  Mass is conserved, so the weighted average is preserved whatever the delays. On the wire:
  the parameters plus one weight to each out-neighbour, every step.
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

Both drain at the last step: every share or answer still on the wire is taken in.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from typing import Any

import torch

from fastsgd.errors import UserError
from fastsgd.options import Option
from fastsgd.strategies.base import Context
from fastsgd.strategies.gossip import TOPOLOGY_OPTIONS, _OnGraph
from fastsgd.strategies.params import assign, flatten

Params = list[torch.nn.Parameter]
PUSH, PAIR = 21, 22  # message tags
REQUEST, ANSWER = 0.0, 1.0


class SGP(_OnGraph):
    name = "sgp"
    CODEC_KINDS = ("exact",)
    OPTIONS = {**TOPOLOGY_OPTIONS, "topology": TOPOLOGY_OPTIONS["topology"].with_default(
        "onepeer")}

    def __init__(self, topology: str = "onepeer", **graph: Any):
        super().__init__(topology, **graph)

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        super().init(params, ctx)
        ctx.transport.start_messages()
        self._received = 0
        return {"weight": torch.ones(1, dtype=torch.float64, device=params[0].device)}

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        assert self.topology is not None
        t, w = ctx.transport, state["weight"]
        x = flatten(params).double() * w
        peers = self.topology.out_neighbors(t.rank, ctx.step)
        share = 1.0 / (len(peers) + 1)
        x, w = x * share, w * share
        message = torch.cat([x, w]).to(params[0].dtype)
        for peer in peers:
            t.post(message, peer, PUSH)
        arrived = t.poll(PUSH)
        if ctx.last_step:
            arrived += [t.wait_message(PUSH) for _ in range(self._expected(ctx) -
                                                             self._received - len(arrived))]
        for _, m in arrived:
            x += m[:-1].double()
            w += m[-1].double()
        self._received += len(arrived)
        state["weight"] = w
        ctx.stats["staleness"] = 0
        assign(params, (x / w).to(params[0].dtype))

    def _expected(self, ctx: Context) -> int:
        """Shares this worker receives over the whole run (the graph is known in advance)."""
        assert self.topology is not None and ctx.total_steps is not None
        return sum(len(self.topology.in_neighbors(ctx.transport.rank, s))
                   for s in range(ctx.total_steps))


class ADPSGD(_OnGraph):
    name = "adpsgd"
    CODEC_KINDS = ("exact",)
    OPTIONS = {**TOPOLOGY_OPTIONS,
               "rotate": Option(bool, False, doc="rotate partners (GossipGraD)")}

    def __init__(self, rotate: bool = False, **graph: Any):
        super().__init__(**graph)
        self.rotate = rotate

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
        self._rng = random.Random(ctx.transport.rank)
        self._asked = [0] * ctx.transport.world_size  # requests sent to each rank
        self._awaiting = 0  # answers still due to this worker
        self._answered = 0  # requests this worker has answered
        self._sent: dict[int, deque[torch.Tensor]] = defaultdict(deque)  # snapshots per peer
        return {}

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        t = ctx.transport
        x = flatten(params)
        for src, m in t.poll(PAIR):
            x = self._take(t, src, m, x)
        if ctx.last_step:
            x = self._drain(t, x)
        elif t.rank % 2 == 0 and t.world_size > 1 and not self._awaiting:
            peer = self._partner(t.rank, ctx.step)
            t.post(torch.cat([x, x.new_tensor([REQUEST])]), peer, PAIR)
            self._sent[peer].append(x)
            self._asked[peer] += 1
            self._awaiting += 1
        assign(params, x)

    def _take(self, t, src: int, m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A request: average, answer with the average. An answer: the average replaces the
        snapshot sent (answers from one peer come in the order of the requests)."""
        if m[-1] == REQUEST:
            average = (x + m[:-1]) / 2
            t.post(torch.cat([average, x.new_tensor([ANSWER])]), src, PAIR)
            self._answered += 1
            return average
        self._awaiting -= 1
        return m[:-1] + (x - self._sent[src].popleft())

    def _drain(self, t, x: torch.Tensor) -> torch.Tensor:
        """Collective: answer every request still coming and collect every answer due."""
        asked = torch.tensor(self._asked, dtype=torch.float64, device=x.device)
        t.all_reduce(asked)
        while self._answered < int(asked[t.rank]) or self._awaiting > 0:
            src, m = t.wait_message(PAIR)
            x = self._take(t, src, m, x)
        return x

    def _partner(self, rank: int, step: int) -> int:
        assert self.topology is not None
        peers = [p for p in self.topology.out_neighbors(rank, step) if p % 2]
        return peers[step % len(peers)] if self.rotate else self._rng.choice(peers)
