"""Asynchronous DiLoCo: the workers run DiLoCo's rounds without waiting for one another.

Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv 2401.09135),
and Douillard et al. 2025, "Decoupled DiLoCo". Every worker runs the user's (inner)
optimizer for `period` steps (H), then pushes its pseudo-gradient (the global parameters it
started the round from - its parameters) to the server, waits for the server's reply, the
current global parameters, and starts its next round from them. The server is a role rank 0
plays beside training (a handler, as in `ps`: on the receiver thread of a real process, at
arrival time in the simulator); it holds the global parameters and the outer momentum.

Order of application (the outer step is DiLoCo's: m <- mu m + g; global <- global - lr (g +
mu m), Nesterov SGD; by default `outer_lr` 1 and no momentum, where DiLoCo has 0.7 and 0.9:
under staleness the momentum compounds pseudo-gradients taken from stale anchors. On the
GPT of experiments/frontier.toml, 8 workers, staleness 2, quorum 1, momentum 0.9 ended at
validation loss 3.16, momentum 0 at 2.46, synchronous DiLoCo at 2.50):

- `staleness` = 0 (lockstep): the server adds up a round's pseudo-gradients and, once every
  worker's is in, takes one outer step on their mean, then answers them all: exactly
  synchronous DiLoCo (strategies/diloco.py; the sum is in arrival order, so equal to ~1e-7).
- `staleness` = s > 0: each pseudo-gradient g is applied as it arrives, the momentum
  delayed (after Liu et al.'s Delayed Nesterov): its gradient term at once, global <-
  global - lr g / n, and the momentum term once per n pushes, on their sum G: m <- mu m +
  G, global <- global - lr mu m (heavy ball: the momentum before). Over n pushes that is
  DiLoCo's step; the plain asynchronous Nesterov (an outer step per push) moves the
  momentum n times a round.
  Its sender is answered at once, unless the bound holds it: a worker starts round r only
  once the slowest worker of the quorum (the `quorum` share of the workers that delivered
  the most rounds) has delivered round r - s - 1.

A worker's rounds end after steps (k + 1) % period == 0 and after its last step. The
server answers the final pushes once the quorum's are all in (everyone's in lockstep); from
then on the global parameters are final (`closed`): a straggler's next push is not applied,
and the answer tells it so, so that it ends its training there (Context.end: its round is
`dropped_steps`, the steps it does not train `idle_steps`). All replicas end with the same
parameters (drains_at_end). `period` is DiLoCo's: 0, the default, is 500 but at least
eight rounds in a shorter run (min(500, steps // 8)).

On the wire, per worker and round: its pseudo-gradient up (through `ctx.compressor`, with
error feedback for lossy codecs, plus two int64 words: the round and a final flag) and the
global parameters down (exact, plus three words: rounds ahead, over, dropped). With a lossy
codec, floating-point buffers (BatchNorm's running statistics) skip it: the push carries
their pseudo-gradient exactly, in their dtype, in a field of its own after the codec's
(`exact_buffers`), as diloco all-reduces them exactly beside its codec; through the codec,
qsgd's noise could take a running variance below zero, and error feedback would carry
statistics from round to round. The server gives them the workers' plain mean, as with the
exact codec (`_step`). State (plain tensors): on every worker `anchor` (the global
parameters its round started from), `rounds`, `ahead` (how many rounds it was ahead of the
quorum's slowest when answered: the `staleness` metric) and, with a lossy codec, `push`
(the codec's residual, of the parameter elements only); on rank 0 also the server's
`global`, `momentum`, `delivered` (rounds delivered, per worker), `closed`, and the round's
`sum` and `count`.
Every worker waits for the answer to its push before it trains on, so at a checkpoint's
barrier nothing is in flight and the state is everything (it resumes bitwise).

The server is one rank: it receives a model-sized message per worker and round, as a
DiLoCo all-reduce moves about twice that per worker; with many workers its link is the
bottleneck (shard it as `ps.servers` does: not done here). A lost worker is not carried on
from (the survivors would wait for its round, and losing rank 0 loses the server): the run
restarts from its last checkpoint.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

from fastsgd.compress.base import Compressor
from fastsgd.compress.wire import pack, unpack
from fastsgd.config.options import Option, at_least, between, positive
from fastsgd.errors import UserError
from fastsgd.strategies.base import Context, StrategyBase, scaled_period
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.diloco import PAPER_PERIOD
from fastsgd.strategies.params import assign, buffer_mask, coded, flatten

Params = list[torch.nn.Parameter]
PUSH, GLOBAL = 51, 52
SERVER = 0


class AsyncDiLoCo(StrategyBase):
    name = "async_diloco"
    capabilities = Capabilities(
        drains_at_end=True,  # the final pushes are answered together (ctx.last_step)
        async_drain=True,  # once the quorum's slowest has pushed
        codec_kinds=("exact", "quantize", "sparse"),  # the push; the answer is exact
        refused_codecs=("dgc",))  # momentum correction: a second momentum on the pseudo-grad
    OPTIONS = {
        "period": Option(int, 0, at_least(0), "inner steps per round (H; 0: DiLoCo's 500, at "
                         "least 8 rounds in a shorter run)", steps=True),
        "staleness": Option(int, 2, at_least(0),
                            "rounds a worker may run ahead of the slowest (0: lockstep DiLoCo)"),
        # no outer momentum by default: under staleness it compounds stale pseudo-gradients
        "outer_lr": Option(float, 1.0, positive, "outer (Nesterov SGD) learning rate"),
        "outer_momentum": Option(float, 0.0, between(0, 0.999), "outer momentum"),
        "nesterov": Option(bool, True, doc="Nesterov outer momentum (false: heavy ball)"),
        "quorum": Option(float, 0.75, between(1e-9, 1.0),
                         "share of the workers the bound and the end wait for (staleness > 0)"),
    }

    def __init__(self, period: int = 0, staleness: int = 2, outer_lr: float = 1.0,
                 outer_momentum: float = 0.0, nesterov: bool = True, quorum: float = 0.75):
        self.period, self.staleness, self.quorum = period, staleness, quorum
        self._period = period or PAPER_PERIOD  # H (init scales period 0 to the run)
        self.outer_lr, self.momentum, self.nesterov = outer_lr, outer_momentum, nesterov
        self._waiting: list[int] = []  # server: workers whose push awaits its answer
        self._final: set[int] = set()  # server: workers whose last push is in
        self._dropped: set[int] = set()  # server: workers whose push came past the end

    def check_compression(self, codec: Compressor, world_size: int) -> None:
        if codec.name in self.capabilities.refused_codecs:
            raise UserError(f"compression.name = '{codec.name}' cannot carry the pseudo-"
                            f"gradient of strategy.name = '{self.name}': its momentum "
                            "correction adds a second momentum to the outer one")

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        t, start = ctx.transport, flatten(params)  # every replica starts from rank 0's
        self._period = self.period or scaled_period(PAPER_PERIOD, ctx.total_steps)
        self._codec, self._transport = ctx.compressor, t
        self._buffers = buffer_mask(params)
        self._waiting, self._final, self._dropped = [], set(), set()
        state: dict[str, Any] = {"anchor": start, "rounds": torch.zeros(1, dtype=torch.int64),
                                 "ahead": torch.zeros(1, dtype=torch.int64)}
        if ctx.compressor.kind != "exact":
            state["push"] = ctx.compressor.init(coded(start, self._buffers))
        t.start_messages()
        if t.rank == SERVER:
            n = t.world_size
            state.update({"global": start.clone(), "momentum": torch.zeros_like(start),
                          "delivered": torch.zeros(n, dtype=torch.int64),
                          "sum": torch.zeros_like(start),
                          "count": torch.zeros(1, dtype=torch.int64),
                          "closed": torch.zeros(1, dtype=torch.int64)})
            self._lock = threading.Lock()
            t.serve(PUSH, lambda src, m: self._on_push(state, src, m))
        return state

    # ---- the server role (rank 0) -------------------------------------------------------
    def _on_push(self, state: dict[str, Any], src: int, message: torch.Tensor) -> None:
        payload = unpack(message, [*self._fields(), "round", "final"], src)
        final = bool(payload.pop("final"))
        payload.pop("round")
        n = self._transport.world_size
        with self._lock:
            if self._over(state):  # the quorum is done: a straggler's late round is dropped
                self._final.add(src)
                self._dropped.add(src)
            else:
                pseudo = self._decode(payload, state["global"])
                self._apply(state, pseudo, n)
                state["delivered"][src] += 1
                if final:
                    self._final.add(src)
            self._waiting.append(src)
            self._answer(state)

    def _fields(self) -> list[str]:
        """A push's fields before its round and final flag: the codec's, then with a lossy
        codec the buffers' exact pseudo-gradient (if the model has buffers)."""
        beside = self._codec.kind != "exact" and self._buffers is not None
        return [*self._codec.FIELDS, *(["exact_buffers"] if beside else [])]

    def _decode(self, payload: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """The pseudo-gradient a push stands for: the codec's parameter elements, the exact
        buffers beside them."""
        exact = payload.pop("exact_buffers", None)
        if exact is None:
            return self._codec.decode(payload, like)
        plain = self._buffers
        pseudo = torch.empty_like(like)
        pseudo[plain] = exact.to(like.dtype)
        pseudo[~plain] = self._codec.decode(payload, like[~plain])
        return pseudo

    def _apply(self, state: dict[str, Any], g: torch.Tensor, n: int) -> None:
        """Lockstep: one outer step on the round's mean once all n are in. Asynchronous:
        Delayed Nesterov (after Liu et al. 2024): each push's gradient term lr g / n
        at once, the momentum term once per n pushes, on their sum G: m <- mu m + G, global
        <- global - lr mu m. Over n pushes that is DiLoCo's step, lr (G + mu m), the
        momentum moving once per n pseudo-gradients as it does in DiLoCo, not once per
        push (which over-counts it n times)."""
        state["sum"] += g / n if self.staleness else g
        state["count"] += 1
        if self.staleness:
            self._step(state, g / n, momentum_too=False)
        if int(state["count"]) == n:
            self._step(state, state["sum"] / (1 if self.staleness else n), momentum_too=True,
                       gradient_too=not self.staleness)
            state["sum"].zero_()
            state["count"].zero_()

    def _step(self, state: dict[str, Any], g: torch.Tensor, momentum_too: bool,
              gradient_too: bool = True) -> None:
        """DiLoCo's outer step on the server's global parameters (diloco.py `_land`): its
        gradient term lr g and its momentum term lr mu m, either or both."""
        momentum, global_ = state["momentum"], state["global"]
        workers_mean = global_ - g
        before = momentum.clone() if momentum_too and not self.nesterov else None
        if momentum_too:
            momentum.mul_(self.momentum).add_(g)
        if momentum_too and gradient_too:  # as diloco.py computes it, bit for bit
            update = g + self.momentum * momentum if self.nesterov else momentum
            global_.sub_(update, alpha=self.outer_lr)
        elif gradient_too:
            global_.sub_(g, alpha=self.outer_lr)
        else:  # the momentum term alone: buffers keep the mean their pushes made
            step = (momentum if before is None else before).clone()
            if self._buffers is not None:
                step[self._buffers] = 0
            global_.sub_(step, alpha=self.outer_lr * self.momentum)
        if self._buffers is not None:  # BatchNorm statistics: the plain mean (params.py)
            plain = self._buffers
            if gradient_too:
                global_[plain] = workers_mean[plain]
            momentum[plain] = 0

    def _quorum(self) -> int:
        """How many workers the bound and the end wait for: all in lockstep."""
        n = self._transport.world_size
        return n if self.staleness == 0 else max(1, math.ceil(self.quorum * n - 1e-9))

    def _over(self, state: dict[str, Any]) -> bool:
        """Has the quorum pushed its final round? The global parameters are final then."""
        return bool(state["closed"])

    def _answer(self, state: dict[str, Any]) -> None:
        """Answer every waiting worker the bound lets start its next round; the final
        pushes once the quorum's are in, and from then on every push, with an end."""
        t, delivered = self._transport, state["delivered"]
        if len(self._final) >= self._quorum():
            state["closed"].fill_(1)
        over = self._over(state)
        # the slowest of the quorum: the q-th most rounds delivered
        paced = int(delivered.sort(descending=True).values[self._quorum() - 1])
        # rank 0 last: once it has its answer, every other answer is counted (its bytes)
        for w in sorted(self._waiting, key=lambda w: (w == SERVER, w)):
            if w in self._final and not over:
                continue
            if not over and paced < int(delivered[w]) - self.staleness:
                continue  # it would start round delivered[w]: the quorum lacks r - s - 1
            self._waiting.remove(w)
            ahead = max(0, int(delivered[w]) - paced)
            t.post(pack({"global": state["global"],  # pack copies
                         "ahead": torch.tensor([ahead], dtype=torch.int64),
                         "end": torch.tensor([int(over), int(w in self._dropped)],
                                             dtype=torch.int64)}), w, GLOBAL)

    # ---- the worker role ----------------------------------------------------------------
    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if not (ctx.last_step or (ctx.step + 1) % self._period == 0):
            ctx.stats["staleness"] = float(state["ahead"])  # kept in the state: it resumes
            return
        t = ctx.transport
        ctx.worked()
        payload = self._push(state["anchor"] - flatten(params), state)
        flags = torch.tensor([int(state["rounds"]), int(ctx.last_step)], dtype=torch.int64)
        t.post(pack({**payload, "round": flags[:1], "final": flags[1:]}), SERVER, PUSH)
        src, reply = t.wait_message(GLOBAL)  # the server's answer: where to start again
        answer = unpack(reply, ["global", "ahead", "end"], src)
        assign(params, answer["global"])
        over, dropped = (bool(x) for x in answer["end"])
        if over and (dropped or not ctx.last_step):  # a straggler past the quorum's end
            ctx.end(dropped=ctx.step % self._period + 1 if dropped else 0)
        state["anchor"] = answer["global"].to(state["anchor"].dtype).clone()
        state["rounds"] += 1
        state["ahead"] = answer["ahead"].clone()
        ctx.stats["staleness"] = float(state["ahead"])  # rounds ahead of the slowest

    def _push(self, pseudo: torch.Tensor, state: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The payload of a push: the codec's (error feedback in `push`), and with a lossy
        codec the buffers' pseudo-gradient beside it, exact (see `_fields`)."""
        if "push" not in state:
            return self._codec.compress(pseudo)
        payload = self._codec.encode(coded(pseudo, self._buffers), state["push"])
        if self._buffers is None:
            return payload
        return {**payload, "exact_buffers": pseudo[self._buffers]}

    def close(self) -> None:
        self._waiting, self._final, self._dropped = [], set(), set()
