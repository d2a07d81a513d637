"""Asynchronous parameter server (Downpour SGD, Dean et al. 2012; Project Adam).

The parameter vector is split into `servers` shards, held by ranks 0..servers-1: a server is
a role those ranks play beside training, answering messages as they arrive (on the receiver
thread of a real process; at arrival time in the simulator). Each worker trains its own
copy with its own optimizer (its state stays with the worker) and, every `n_push` steps,
pushes the change its optimizer made since the last push; every `n_fetch` steps it asks for
the servers' parameters and, when they come, takes them, keeping the progress it made since
it asked. A worker asks a server again only once its last request is answered (at the
last step it always asks): requests piling up faster than a busy server answers would make
every answer older, and each one costs the worker a pass over the snapshots still out.
Nobody waits for anyone, except at the end: a server answers the final fetches once every
worker's final push is in (a worker's push reaches a server before its fetch does), so all
workers end with the servers' final parameters. A server adds up every worker's steps where
synchronous SGD averages them: with `adapt_optimizer` (the default) it applies each push at
1/n, and the workers' momentum is lowered for the momentum that n asynchronous workers bring
(Mitliagkas et al. 2016; staleness.py), so the synchronous lr and momentum train as they do
under allreduce. With `staleness_lr`, a server scales a push by 1/staleness instead, the
number of pushes it applied since the pusher last fetched (Zhang et al. 2016). On the wire:
parameter deltas up, parameters down. With a lossy codec,
pushes are encoded with error feedback (a residual per shard on the worker), and a server
answers a fetch with the compressed change since what it last told that worker; both ends
keep that copy, so nothing drifts.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import torch

from fastsgd.compress.base import Compressor
from fastsgd.compress.wire import pack, unpack
from fastsgd.config.options import Option, at_least
from fastsgd.errors import UserError
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.params import assign, flatten
from fastsgd.strategies.staleness import ADAPT_OPTION, Adjustment, queue_staleness
from fastsgd.transport.base import PeerLost

Params = list[torch.nn.Parameter]
PUSH, FETCH, PARAMS = 31, 32, 33


class ParameterServer(StrategyBase):
    name = "ps"
    capabilities = Capabilities(
        drains_at_end=True,  # a final push and fetch, waited for (ctx.last_step)
        async_drain=True,  # ... until every worker's final push is in
        codec_kinds=("exact", "quantize", "sparse"),
        carries_on=("exact", "quantize", "sparse"),  # a server forgets a lost worker
        carries_on_real=True,  # also on real processes: no collective while training
        rejoins=("exact",))  # a new worker may take a lost one's place (run.rejoin)
    OPTIONS = {
        "n_push": Option(int, 1, at_least(1), "steps between pushes"),
        "n_fetch": Option(int, 1, at_least(1), "steps between fetches"),
        "servers": Option(int, 1, at_least(1), "ranks holding a shard"),
        "staleness_lr": Option(bool, False, doc="scale pushes by 1/staleness"),
        "adapt_optimizer": ADAPT_OPTION,
    }

    def __init__(self, n_push: int = 1, n_fetch: int = 1, servers: int = 1,
                 staleness_lr: bool = False, adapt_optimizer: bool = True):
        self.n_push, self.n_fetch, self.servers = n_push, n_fetch, servers
        self.staleness_lr, self.adapt_optimizer = staleness_lr, adapt_optimizer

    def check(self, world_size: int) -> None:
        if self.servers > world_size:
            raise UserError(f"strategy.servers = {self.servers} but there are only "
                            f"{world_size} workers")

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        self.check(ctx.transport.world_size)
        t, flat = ctx.transport, flatten(params)
        sizes = [len(c) for c in torch.arange(flat.numel()).tensor_split(self.servers)]
        self._slices = [slice(sum(sizes[:k]), sum(sizes[:k + 1])) for k in range(self.servers)]
        self._pushed = flat  # parameters when we last pushed
        self._versions = [0] * self.servers  # server versions our copy is based on
        self._asked: list[deque[torch.Tensor]] = [deque() for _ in range(self.servers)]
        self._last_fetch = 0
        self._codec = codec = ctx.compressor
        # adapt_optimizer (staleness.py): the server adds every worker's steps where
        # synchronous SGD averages them, so it applies each push at 1/n (staleness_lr:
        # 1/staleness instead); n workers updating it asynchronously bring the implicit
        # momentum 1 - 1/n, taken off the workers' explicit momentum
        if self.adapt_optimizer:
            Adjustment(staleness=queue_staleness(t.world_size)).apply(ctx.optimizer)
        t.start_messages()
        self._transport = t
        shards = [flat[part].clone() for part in self._slices]
        state: dict[str, Any] = {}
        if codec.kind != "exact":  # what we hold back of each push, what each server told us
            state["push"] = [codec.init(shard) for shard in shards]
            state["view"] = [shard.clone() for shard in shards]
        if t.rank < self.servers:
            state["shard"] = shards[t.rank].clone()
            state["version"] = torch.zeros(1, dtype=torch.int64)
            if codec.kind != "exact":  # per worker: what this server last told it
                state["told"] = [shards[t.rank].clone() for _ in range(t.world_size)]
            self._lock = threading.Lock()
            t.serve(PUSH, lambda src, m: self._apply_push(state, src, m))
            self._final: set[int] = set()  # workers whose final fetch waits for the others
            self._final_answered = False
            self._lost: set[int] = set()  # workers lost, as the final fetches tell
            t.serve(FETCH, lambda src, m: self._on_fetch(t, state, src, m))
        return state

    # ---- the server role ----------------------------------------------------------------
    def _apply_push(self, state: dict[str, Any], src: int, message: torch.Tensor) -> None:
        delta, based_on = receive(self._codec, message, state["shard"], src)
        n = len(self._transport.members())  # a lost worker is forgotten: 1/survivors
        with self._lock:
            staleness = int(state["version"]) - based_on
            scale = (1.0 / max(1, staleness) if self.staleness_lr
                     else 1.0 / n if self.adapt_optimizer else 1.0)
            state["shard"].add_(delta, alpha=scale)
            state["version"] += 1

    def _on_fetch(self, t, state: dict[str, Any], src: int, fetch: torch.Tensor) -> None:
        """A fetch: [0], or [1, the workers the sender knows lost...] for a final one (on
        real processes a worker may learn of a loss before its server does)."""
        if not fetch[0]:
            return self._answer_fetch(t, state, src)
        with self._lock:  # (a worker asks again after a loss: the survivors may be all in)
            self._final.add(src)
            self._lost.update(int(r) for r in fetch[1:])
            done = (self._final_answered
                    or not set(t.members()) - self._lost <= self._final)
            self._final_answered = self._final_answered or not done
        for worker in [] if done else sorted(self._final):
            self._answer_fetch(t, state, worker)

    def _answer_fetch(self, t, state: dict[str, Any], src: int) -> None:
        with self._lock:
            shard, version = state["shard"].clone(), int(state["version"])
        if "told" not in state:
            t.post(message(self._codec.compress(shard), version), src, PARAMS)
            return
        payload = self._codec.compress(shard - state["told"][src])
        state["told"][src] += self._codec.decode(payload, shard)  # the worker adds the same
        t.post(message(payload, version), src, PARAMS)

    # ---- the worker role ----------------------------------------------------------------
    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        t, step, last = ctx.transport, ctx.step + 1, ctx.last_step
        local = self._take_replies(flatten(params), t.poll(PARAMS), step, state)
        if step % self.n_push == 0 or last:
            for k, part in enumerate(self._slices):
                delta = local[part] - self._pushed[part]
                payload = (self._codec.encode(delta, state["push"][k]) if "push" in state
                           else self._codec.compress(delta))
                # a lost push is skipped: its progress stays in this worker's copy until
                # the next fetch replaces it (docs/strategies.md)
                t.post(message(payload, self._versions[k]), k, PUSH, droppable=True)
            self._pushed = local
        if step % self.n_fetch == 0 or last:
            for k, part in enumerate(self._slices):
                if self._asked[k] and not last:
                    continue  # the last request is still unanswered: no pile-up
                self._asked[k].append(self._pushed[part].clone())
                t.post(_final_fetch(t) if last else torch.zeros(1), k, FETCH)
        if last:
            local = self._take_replies(local, self._final_replies(t), step, state)
        ctx.stats["staleness"] = step - self._last_fetch
        assign(params, local)

    def _final_replies(self, t) -> list[tuple[int, torch.Tensor]]:
        """Every answer due; when a worker is found lost meanwhile, the final fetches are
        sent again, so that a server waiting for the lost one's sees its survivors all in."""
        due, replies = sum(len(q) for q in self._asked), []
        while len(replies) < due:
            try:
                replies.append(t.wait_message(PARAMS))
            except PeerLost:
                for k in range(self.servers):
                    t.post(_final_fetch(t), k, FETCH)
        return replies

    def settle(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        """Before a checkpoint: one more fetch from every server, all answers waited for.
        A server answers a worker's fetch after its earlier pushes (one channel, in order),
        so once every worker has settled no push or answer is in flight."""
        t, local = ctx.transport, flatten(params)
        for k, part in enumerate(self._slices):
            if not self._asked[k]:
                self._asked[k].append(self._pushed[part].clone())
                t.post(torch.zeros(1), k, FETCH)
        due = sum(len(q) for q in self._asked)
        assign(params, self._take_replies(local, [t.wait_message(PARAMS) for _ in range(due)],
                                          ctx.step, state))

    def in_flight_state(self) -> dict[str, Any]:
        """The worker's side, after `settle`: its last push, the versions it is based on."""
        return {"pushed": self._pushed, "versions": list(self._versions),
                "last_fetch": self._last_fetch}

    def load_in_flight(self, saved: dict[str, Any]) -> None:
        self._pushed, self._last_fetch = saved["pushed"], saved["last_fetch"]
        self._versions = list(saved["versions"])

    def donate(self, state: dict[str, Any]) -> dict[str, Any]:
        """A worker joins from this one's state (run.rejoin): not its server role, which
        stays with its rank (servers are never replaced: first_expendable)."""
        return {k: v for k, v in state.items() if k not in ("shard", "version", "told")}

    def joined(self, step: int, params: Params) -> None:
        """This process took a lost worker's place: it pushes only its own progress from
        here on (the donor pushes what it had made)."""
        self._pushed = flatten(params).clone()

    def _take_replies(self, local: torch.Tensor, replies: list, step: int,
                      state: dict[str, Any]) -> torch.Tensor:
        """A server's shard S replaces ours, plus what we changed since we asked for it; the
        push baseline, and the snapshots of later requests still out, move by the same jump
        (S minus what we had pushed when we asked)."""
        if not replies:
            return local
        local, self._pushed = local.clone(), self._pushed.clone()
        for src, reply in replies:
            part, pushed_then = self._slices[src], self._asked[src].popleft()
            shard, version = receive(self._codec, reply, pushed_then, src)
            if "view" in state:  # the server sent the change since what it told us last
                shard = state["view"][src].add_(shard).clone()
            jump = shard - pushed_then
            local[part] += jump
            self._pushed[part] += jump
            for later in self._asked[src]:
                later += jump
            self._versions[src] = version
        self._last_fetch = step
        return local

    def close(self) -> None:
        return None


def message(payload: dict[str, torch.Tensor], version: int) -> torch.Tensor:
    """A push or a reply on the wire: the codec's payload and the server version it is from."""
    return pack({**payload, "version": torch.tensor([version], dtype=torch.int64)})


def receive(codec: Compressor, buffer: torch.Tensor, like: torch.Tensor,
            src: int) -> tuple[torch.Tensor, int]:
    payload = unpack(buffer, [*codec.FIELDS, "version"], src)
    return codec.decode(payload, like), int(payload.pop("version"))


def _final_fetch(t) -> torch.Tensor:
    """A final fetch, with the workers this one knows lost."""
    return torch.tensor([1.0, *sorted(t.departed())])
