"""Stochastic gradient push: asynchronous decentralized averaging in which nobody waits
for the slowest worker (the pairwise kind, adpsgd, is in pairwise.py; the arithmetic of
both averages, in async_averages.py).

- `sgp`: stochastic gradient push (Assran et al. 2019): push-sum on directed, time-varying
  graphs (default: the one-peer exponential graph). Each worker keeps a numerator x and a
  weight w, trains the de-biased z = x / w, and after each step pushes equal shares of
  (x, w) to its out-neighbours, then adds in whatever shares have arrived, without waiting.
  Mass is conserved, so the weighted average is preserved whatever the delays. On the wire:
  the parameters plus one weight to each out-neighbour, every step. A push moves the change
  since a copy of the sender's parameters that both ends of the edge keep, so that it can be
  compressed: the receiver adds its weight times the copy and the sender loses exactly that;
  what a codec holds back stays with the sender, so with a lossy codec a push moves only
  `gamma` of the share (as CHOCO-gossip's step, Koloskova et al. 2019). What stays moves
  the sender's de-biased model away from the edge's copy by gamma/(d+1-gamma) of their gap
  at each push, and the codec must close more of the gap than that: by default (`gamma`
  0) the step shrinks with the codec's quality, as CHOCO's (gossip.auto_gamma).
  With an exact codec (`none`) the push carries the parameters themselves and nobody keeps
  copies (each one is a model per edge: 58 MB per simulated MLP worker on the one-peer graph
  of 256 workers).
A worker whose uplink is slower than its steps would queue a push per step until its
receivers wait for it (max_lag), a model per step held by the sender; with `max_in_flight`
(default 1) it pushes only once the pushes of that many steps before have left it, as the
reference implementation gossips one round at a time (Assran et al. 2019): the same steps
per second, pushes that are fresher, and one model queued instead of max_lag of them.
It drains at the last step: every share still on the wire is taken in. Then,
with `average_at_end` (the default), one all-reduce replaces every replica by the average
(of the de-biased models, with the weights reset to 1), so the run ends in
consensus like the synchronous strategies; `false` keeps each replica's own model, to
study how far apart they end.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from fastsgd.compress.wire import pack, unpack
from fastsgd.config.options import Option, at_least, between
from fastsgd.strategies.async_averages import push_sum, push_sum_in_place, sent_copy
from fastsgd.strategies.base import Context
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.gossip import (
    END_OPTIONS,
    TOPOLOGY_OPTIONS,
    Edge,
    OnGraph,
    auto_gamma,
    opens_late,
    take_start,
)
from fastsgd.strategies.membership import await_messages
from fastsgd.strategies.params import assign, flatten
from fastsgd.transport.base import Handle, PeerLost

Params = list[torch.nn.Parameter]
PUSH = 21  # message tag (adpsgd's PAIR is 22)
MAX_LAG = 16  # sgp: steps a push may lag behind its receiver (max_lag)


class SGP(OnGraph):
    name = "sgp"
    capabilities = Capabilities(
        drains_at_end=True,  # takes in every push still on the wire (ctx.total_steps)
        async_drain=True,  # the slowest's pushes included
        codec_kinds=("exact", "quantize", "sparse"),
        carries_on=("exact", "quantize", "sparse"),  # a lost worker's share leaves with it
        carries_on_real=True,  # also on real processes: no collective while training
        rejoins=("exact", "quantize", "sparse"))  # a new worker may take a lost one's place
    OPTIONS = {**TOPOLOGY_OPTIONS, "topology": TOPOLOGY_OPTIONS["topology"].with_default(
        "onepeer"), "gamma": Option(float, 0.0, between(0, 1), "push step (lossy codecs only; "
                                    "0: from the codec's compression)"),
        "max_lag": Option(int, MAX_LAG, at_least(0), "at step k, first wait for the "
                          "in-neighbours' pushes of step k - max_lag (0: never wait)"),
        "max_in_flight": Option(int, 1, at_least(0), "steps whose pushes may still be "
                                "leaving this worker when it pushes again; it waits for "
                                "older ones (0: never wait)"),
        **END_OPTIONS}

    def __init__(self, topology: str = "onepeer", gamma: float = 0.0, max_lag: int = MAX_LAG,
                 max_in_flight: int = 1, average_at_end: bool = True, **graph: Any):
        super().__init__(topology, **graph)
        self.gamma, self.max_lag, self.average_at_end = gamma, max_lag, average_at_end
        self.max_in_flight = max_in_flight
        self._in_flight: deque[list[Handle]] = deque()  # per step, its pushes' handles

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        super().init(params, ctx)
        ctx.transport.start_messages()
        self._in_flight = deque()
        self._received = 0
        self._since = 0  # the first step this process takes part in (a joiner's: later)
        self._seen: dict[int, int] = {}  # per sender: the latest step it pushed from
        self._floor: int | None = 0  # pushes of earlier steps were all taken in (max_lag)
        self._codec = ctx.compressor
        self._fields = [*self._codec.FIELDS, "weight", "number"]
        start = flatten(params)
        self._step = 1.0 if self._codec.kind == "exact" else self.gamma or auto_gamma(
            self._codec, start)
        state = {"weight": torch.ones(1, dtype=torch.float64, device=start.device),
                 "sent": {}, "received": {},  # the edges' copies (lossy codecs)
                 "pushed": {}, "taken": {}, "held": {}}  # per edge: pushes numbered, early ones
        if self._codec.kind != "exact":  # every replica starts here, and so does each copy
            state["start"] = start.double()
        return state

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        # Polled first, shares sent, numerator formed last, each step in a function of its
        # own: where a simulated worker waits it hands over to the others, and 1024 of them
        # each holding model-sized buffers across that point would not fit in memory.
        t = ctx.transport
        self._hold(t.poll(PUSH), state)
        peers, share = self._send_shares(params, state, ctx)
        if ctx.last_step:  # the final drain
            assert ctx.total_steps is not None
            steps = ctx.total_steps
            self._hold(await_messages(t, PUSH, lambda: self._expected(t, steps) -
                                      self._received), state)
        elif self.max_lag:
            self._await_lagging(t, ctx.step, state)
        ready = self._in_order(state)
        for edge, _ in ready:  # a late edge's first push: its copy starts from the model sent
            if "start" in state and edge not in state["received"] and opens_late(self._since,
                                                                                 edge):
                take_start(t, state, "received", edge)
        ctx.stats["staleness"] = max([ctx.step - int(p["number"][2]) for _, p in ready],
                                     default=0)
        z = None  # exact: mixed into the parameters themselves
        if self._codec.kind == "exact":
            push_sum_in_place(t, params, peers, share, ready, state)
        else:
            z = push_sum(self._codec, params, peers, share, ready, state)
        del ready
        if ctx.last_step and self.average_at_end:
            # the plain mean of the de-biased models, as run.representative = "average"
            # evaluates: weighting by w (sum x / sum w) let a straggler's skewed weight pull
            # the result off (sgp on a ring with a 3x straggler: 0.29 accuracy against 0.7)
            t.await_deferred()  # the mix
            z = flatten(params) if z is None else z.to(params[0].dtype)
            t.all_reduce(z, average=True)
            state["weight"] = torch.ones_like(state["weight"])
        if z is not None:
            assign(params, z)

    def _send_shares(self, params: Params, state: dict[str, Any],
                     ctx: Context) -> tuple[list[Edge], torch.Tensor]:
        """Push a share of (x, w) to each out-neighbour; the peers and the share."""
        assert self.topology is not None
        while self.max_in_flight and len(self._in_flight) >= self.max_in_flight:
            for handle in self._in_flight.popleft():  # as a blocking send on a full socket
                handle.wait()
        t = ctx.transport
        z = None if self._codec.kind == "exact" else flatten(params)  # exact: packed as they are
        gone = t.absent(ctx.step) | set(t.departed())  # no share for a lost peer: it stays
        peers = [p for p in self.topology.out_neighbors(t.rank, ctx.step) if p not in gone]
        share = state["weight"] * (self._step / (len(peers) + 1))
        pushed = [self._push(t, peer, params, z, share, state, ctx.step) for peer in peers]
        if self.max_in_flight:  # else nothing waits for them
            self._in_flight.append(pushed)
        return [(p, t.returned_at(p, ctx.step)) for p in peers], share  # a copy per edge

    def settle(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        """Before a checkpoint: take in every push sent to this worker so far; they wait in
        `state["held"]` and are mixed in at the next step."""
        t = ctx.transport
        self._hold(t.poll(PUSH), state)
        due = self._expected(t, ctx.step) - self._received
        self._hold([t.wait_message(PUSH) for _ in range(due)], state)

    def in_flight_state(self) -> dict[str, Any]:
        return {"received": self._received, "since": self._since}

    def load_in_flight(self, saved: dict[str, Any]) -> None:
        self._received, self._since = saved["received"], saved.get("since", 0)
        self._seen, self._floor = {}, None  # from the step it resumes at (settle took all)

    def donate(self, state: dict[str, Any]) -> dict[str, Any]:
        """A worker joins in a lost one's place starting from this one's state (run.rejoin):
        each keeps half the weight, so the mass is conserved and both de-bias to the
        same model; the joiner's edges start afresh (its pushes are numbered from its join
        step on, the receivers tell them apart by that)."""
        state["weight"] = state["weight"] / 2
        return {**state, "pushed": {}, "taken": {}, "held": {}, "sent": {}, "received": {}}

    def joined(self, step: int, params: Params) -> None:
        """This process took a lost worker's place at `step`: it counts only the pushes sent
        to it from then on."""
        self._since, self._received, self._seen, self._floor = step, 0, {}, step

    def _push(self, t, peer: int, params: Params, z: torch.Tensor | None, share: torch.Tensor,
              state: dict[str, Any], step: int) -> Handle:
        """Send `peer` a share of weight and the compressed change of z (the flat model; None
        with the exact codec, which sends the parameters themselves) since the edge's copy
        (Taheri et al. 2020 track such copies for quantized push-sum), and move the copy on as
        the peer will: the peer takes it for z."""
        # numbered per edge and per process at each end: a new process that took a lost
        # one's place, sending or receiving, starts a new sequence and a new copy (run.rejoin)
        edge = (peer, t.returned_at(peer, step))
        number = state["pushed"].get(edge, 0)
        state["pushed"][edge] = number + 1
        number = [self._since, number, step]
        copy = None
        if z is None:  # exact: the model itself (one flat copy if its dtypes differ)
            uniform = len({p.dtype for p in params}) == 1
            fields: dict[str, Any] = {"values": params if uniform else flatten(params)}
        else:
            copy = sent_copy(t, state, "sent", edge, self._since, z)
            fields = self._codec.compress((z.double() - copy).to(z.dtype))
        buffer = pack({**fields, "weight": share,
                       "number": torch.tensor(number, device=share.device)})
        handle = t.post(buffer, peer, PUSH)
        if copy is not None:
            payload = unpack(buffer, self._fields, t.rank)  # as the peer will decode it
            copy.add_(self._codec.decode({k: payload[k] for k in self._codec.FIELDS}, z))
        return handle

    def _in_order(self, state: dict[str, Any]) -> list[tuple[Edge, dict[str, torch.Tensor]]]:
        """The pushes that can be applied now, each edge's in the order they were sent (its
        copy changes with each one); one that overtook an earlier one waits for it."""
        held = state["held"]
        ready = []
        for src, since in sorted({(src, since) for src, since, _ in held}):
            number = state["taken"].get((src, since), 0)
            while (src, since, number) in held:
                ready.append(((src, since), self._unpacked(held.pop((src, since, number)), src)))
                number += 1
            state["taken"][(src, since)] = number
        return ready

    def _hold(self, arrived: list[tuple[int, torch.Tensor]], state: dict[str, Any]) -> None:
        """Count pushes and keep them in `state["held"]` as they came (a checkpoint saves
        them), by (sender, its process, number); note the step each sender pushed from."""
        self._received += len(arrived)
        for src, buffer in arrived:
            since, number, step = unpack(buffer, self._fields, src, copy=False)["number"].tolist()
            state["held"][(src, int(since), int(number))] = buffer
            self._seen[src] = max(self._seen.get(src, -1), int(step))

    def _unpacked(self, held: torch.Tensor | dict, src: int) -> dict[str, torch.Tensor]:
        """A held push's fields; with the exact codec views of its buffer, which the mix only
        reads (checkpoints of earlier versions held them unpacked already)."""
        if isinstance(held, dict):
            return held
        return unpack(held, self._fields, src, copy=self._codec.kind != "exact")

    def _await_lagging(self, t, step: int, state: dict[str, Any]) -> None:
        """Wait until the pushes of step - max_lag from every in-neighbour still there have
        come: a bound on how far apart in steps the replicas drift (tau-overlap SGP, Assran
        et al. 2019). Unbounded, a process that runs a little slower falls ever further
        behind, and mixing in its ever older model pulled 4 real processes apart (0.52
        accuracy after 40,000 steps of the MLP where one process scored 0.89)."""
        if self._floor is None:  # resumed: pushes from before this step were all taken in
            self._floor = step
        lagging = step - self.max_lag
        if lagging < self._floor:
            return
        assert self.topology is not None
        while True:
            gone = t.absent(lagging) | set(t.departed())
            if all(self._seen.get(p, -1) >= lagging
                   for p in self.topology.in_neighbors(t.rank, lagging) if p not in gone):
                return
            try:
                self._hold([t.wait_message(PUSH)], state)
            except PeerLost:
                continue  # counted out: asked again

    def _expected(self, t, steps: int) -> int:
        """Shares this process receives in the first `steps` steps (the graph is known in
        advance; a lost peer sent none from the step it left at, and one that took its
        place sends from the step it joined at)."""
        assert self.topology is not None
        count = 0
        for s in range(self._since, steps):
            gone = t.absent(s)
            count += sum(1 for p in self.topology.in_neighbors(t.rank, s) if p not in gone)
        return count

