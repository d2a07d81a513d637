"""Asynchronous DiLoCo: the workers run DiLoCo's rounds without waiting for one another.

Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv 2401.09135),
and Douillard et al. 2025, "Decoupled DiLoCo". Every worker runs the user's (inner)
optimizer for `period` steps (H), then pushes its pseudo-gradient (the global parameters it
started the round from - its parameters) to the server, waits for the server's reply, the
current global parameters, and starts its next round from them. The server is a role rank 0
plays beside training (a handler, as in `ps`: on the receiver thread of a real process, at
arrival time in the simulator); it holds the global parameters and the outer momentum.

Order of application (the outer step is DiLoCo's: m <- mu m + g; global <- global - lr (g +
mu m), Nesterov SGD with `outer_lr` 0.7 and `outer_momentum` 0.9):

- `staleness` = 0 (lockstep): the server adds up a round's pseudo-gradients and, once every
  worker's is in, takes one outer step on their mean, then answers them all: exactly
  synchronous DiLoCo (strategies/diloco.py; the sum is in arrival order, so equal to ~1e-7).
- `staleness` = s > 0: each pseudo-gradient g is applied as it arrives, as g / workers (one
  outer step each, so the momentum moves once per push: Liu et al.'s plain asynchronous
  Nesterov, not their Delayed Nesterov), and its sender is answered at once, unless the
  bound holds it: a worker starts round r only once every worker has delivered round
  r - s - 1 (rounds from 0), so none is more than s rounds ahead of the slowest.

A worker's rounds end after steps (k + 1) % period == 0 and after its last step. On the last
step (ctx.last_step) the server answers the final pushes only once every worker's is in, so
all replicas end with the same, final global parameters (drains_at_end). `period` is
DiLoCo's (500 by default); a run shorter than a period has one outer step, at its end.

On the wire, per worker and round: its pseudo-gradient up (through `ctx.compressor`, with
error feedback for lossy codecs, plus two int64 words: the round and a final flag) and the
global parameters down (exact, plus one word). State (plain tensors): on every worker
`anchor` (the global parameters its round started from), `rounds`, `ahead` (how many
rounds it was ahead of the slowest when answered: the `staleness` metric) and, with a lossy codec,
`push` (the codec's residual); on rank 0 also the server's `global`, `momentum`,
`delivered` (rounds delivered, per worker) and, for the lockstep sum, `sum` and `count`.
Every worker waits for the answer to its push before it trains on, so at a checkpoint's
barrier nothing is in flight and the state is everything (it resumes bitwise).

The server is one rank: it receives a model-sized message per worker and round, as a
DiLoCo all-reduce moves about twice that per worker; with many workers its link is the
bottleneck (shard it as `ps.servers` does: not done here). A lost worker is not carried on
from (the survivors would wait for its round, and losing rank 0 loses the server): the run
restarts from its last checkpoint.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from fastsgd.compress.base import Compressor
from fastsgd.compress.wire import pack, unpack
from fastsgd.config.options import Option, at_least, between, positive
from fastsgd.errors import UserError
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.params import assign, buffer_mask, flatten

Params = list[torch.nn.Parameter]
PUSH, GLOBAL = 51, 52
SERVER = 0


class AsyncDiLoCo(StrategyBase):
    name = "async_diloco"
    capabilities = Capabilities(
        drains_at_end=True,  # the final pushes are answered together (ctx.last_step)
        codec_kinds=("exact", "quantize", "sparse"),  # the push; the answer is exact
        refused_codecs=("dgc",))  # momentum correction: a second momentum on the pseudo-grad
    OPTIONS = {
        "period": Option(int, 500, at_least(1), "inner steps per round (H)",
                         steps=True),
        "staleness": Option(int, 2, at_least(0),
                            "rounds a worker may run ahead of the slowest (0: lockstep DiLoCo)"),
        "outer_lr": Option(float, 0.7, positive, "outer (Nesterov SGD) learning rate"),
        "outer_momentum": Option(float, 0.9, between(0, 0.999), "outer momentum"),
        "nesterov": Option(bool, True, doc="Nesterov outer momentum (false: heavy ball)"),
    }

    def __init__(self, period: int = 500, staleness: int = 2, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, nesterov: bool = True):
        self.period, self.staleness = period, staleness
        self.outer_lr, self.momentum, self.nesterov = outer_lr, outer_momentum, nesterov
        self._waiting: list[int] = []  # server: workers whose push awaits its answer
        self._final: set[int] = set()  # server: workers whose last push is in

    def check_compression(self, codec: Compressor, world_size: int) -> None:
        if codec.name in self.capabilities.refused_codecs:
            raise UserError(f"compression.name = '{codec.name}' cannot carry the pseudo-"
                            f"gradient of strategy.name = '{self.name}': its momentum "
                            "correction adds a second momentum to the outer one")

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        t, start = ctx.transport, flatten(params)  # every replica starts from rank 0's
        self._codec, self._transport = ctx.compressor, t
        self._buffers = buffer_mask(params)
        self._waiting, self._final = [], set()
        state: dict[str, Any] = {"anchor": start, "rounds": torch.zeros(1, dtype=torch.int64),
                                 "ahead": torch.zeros(1, dtype=torch.int64)}
        if ctx.compressor.kind != "exact":
            state["push"] = ctx.compressor.init(start)
        t.start_messages()
        if t.rank == SERVER:
            n = t.world_size
            state.update({"global": start.clone(), "momentum": torch.zeros_like(start),
                          "delivered": torch.zeros(n, dtype=torch.int64),
                          "sum": torch.zeros_like(start),
                          "count": torch.zeros(1, dtype=torch.int64)})
            self._lock = threading.Lock()
            t.serve(PUSH, lambda src, m: self._on_push(state, src, m))
        return state

    # ---- the server role (rank 0) -------------------------------------------------------
    def _on_push(self, state: dict[str, Any], src: int, message: torch.Tensor) -> None:
        payload = unpack(message, [*self._codec.FIELDS, "round", "final"], src)
        final = bool(payload.pop("final"))
        payload.pop("round")
        pseudo = self._codec.decode(payload, state["global"])
        n = self._transport.world_size
        with self._lock:
            if self.staleness == 0:  # lockstep: one outer step on the round's mean
                state["sum"] += pseudo
                state["count"] += 1
                if int(state["count"]) == n:
                    self._outer_step(state, state["sum"] / n)
                    state["sum"].zero_()
                    state["count"].zero_()
            else:
                self._outer_step(state, pseudo / n)
            state["delivered"][src] += 1
            self._waiting.append(src)
            if final:
                self._final.add(src)
            self._answer(state)

    def _outer_step(self, state: dict[str, Any], g: torch.Tensor) -> None:
        """DiLoCo's outer step on the server's global parameters (diloco.py `_land`)."""
        momentum, global_ = state["momentum"], state["global"]
        workers_mean = global_ - g
        momentum.mul_(self.momentum).add_(g)
        update = g + self.momentum * momentum if self.nesterov else momentum
        global_.sub_(update, alpha=self.outer_lr)
        if self._buffers is not None:  # BatchNorm statistics: the plain mean (params.py)
            plain = self._buffers
            global_[plain], momentum[plain] = workers_mean[plain], 0

    def _answer(self, state: dict[str, Any]) -> None:
        """Answer every waiting worker the bound lets start its next round; the final
        pushes once all are in."""
        t, delivered = self._transport, state["delivered"]
        everyone_done = len(self._final) == t.world_size
        # rank 0 last: once it has its answer, every other answer is counted (its bytes)
        for w in sorted(self._waiting, key=lambda w: (w == SERVER, w)):
            if w in self._final and not everyone_done:
                continue
            if w not in self._final and int(delivered.min()) < int(delivered[w]) - self.staleness:
                continue  # it would start round delivered[w]: a worker lacks round r - s - 1
            self._waiting.remove(w)
            ahead = int(delivered[w] - delivered.min())
            t.post(pack({"global": state["global"],  # pack copies
                         "ahead": torch.tensor([ahead], dtype=torch.int64)}), w, GLOBAL)

    # ---- the worker role ----------------------------------------------------------------
    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if not (ctx.last_step or (ctx.step + 1) % self.period == 0):
            ctx.stats["staleness"] = float(state["ahead"])  # kept in the state: it resumes
            return
        t, codec = ctx.transport, self._codec
        pseudo = state["anchor"] - flatten(params)
        payload = codec.encode(pseudo, state["push"]) if "push" in state else (
            codec.compress(pseudo))
        flags = torch.tensor([int(state["rounds"]), int(ctx.last_step)], dtype=torch.int64)
        t.post(pack({**payload, "round": flags[:1], "final": flags[1:]}), SERVER, PUSH)
        src, reply = t.wait_message(GLOBAL)  # the server's answer: where to start again
        answer = unpack(reply, ["global", "ahead"], src)
        assign(params, answer["global"])
        state["anchor"] = answer["global"].to(state["anchor"].dtype).clone()
        state["rounds"] += 1
        state["ahead"] = answer["ahead"].clone()
        ctx.stats["staleness"] = float(state["ahead"])  # rounds ahead of the slowest

    def close(self) -> None:
        self._waiting, self._final = [], set()
