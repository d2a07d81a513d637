"""Tournament training, LTFB (Jacobs et al. 2017, "Towards scalable parallel training of
deep neural networks", LBANN): workers train independently; every `period` steps they meet
in pairs (a new random pairing each round, the same on every worker), swap models, and each
keeps whichever scores better on its own sample of the data, by the user's own loss. On the
wire: the whole parameter vector to the partner, once per round, in the codec's form: the
partner's model is judged as it arrived, so a lossy codec's model wins only if it still
scores better (half precision costs next to nothing; a 1-bit model seldom wins).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from fastsgd.compress.collectives import decode_buffer
from fastsgd.compress.wire import pack
from fastsgd.config.options import Option, at_least
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.params import assign, flatten
from fastsgd.strategies.staleness import ADAPT_OPTION, Adjustment
from fastsgd.transport.base import PeerLost

Params = list[torch.nn.Parameter]


class Tournament(StrategyBase):
    name = "ltfb"
    capabilities = Capabilities(
        codec_kinds=("exact", "quantize", "sparse"),
        carries_on=("exact", "quantize", "sparse"),  # a lost partner's round is skipped
        carries_on_real=True,  # also on real processes: no collective while training
        rejoins=("exact",))  # a new worker may take a lost one's place (run.rejoin): donate
    OPTIONS = {"period": Option(int, 50, at_least(1), "steps between tournament rounds",
                                steps=True),
               "adapt_optimizer": ADAPT_OPTION}

    def __init__(self, period: int = 50, adapt_optimizer: bool = True):
        self.period, self.adapt_optimizer = period, adapt_optimizer

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        # n models, each trained alone on the batch of one worker: the rate tuned for the
        # global batch n B, scaled to B by the linear scaling rule (staleness.py)
        if self.adapt_optimizer:
            Adjustment(lr_scale=1.0 / ctx.transport.world_size).apply(ctx.optimizer)
        return {"wins": torch.zeros(1, dtype=torch.int64)}

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        if (ctx.step + 1) % self.period or ctx.score is None:
            return
        partner = pairing(ctx.transport.world_size, (ctx.step + 1) // self.period)
        t = ctx.transport
        peer = partner.get(t.rank)
        if peer is None or peer in t.absent(ctx.step) | set(t.departed()):
            return  # lost, or lost and not yet back (run.rejoin: back from its join step)
        mine = flatten(params)
        outgoing = pack(ctx.compressor.compress(mine))
        try:  # same codec, same model: same payload size
            incoming = ctx.transport.exchange([(peer, outgoing)], [peer], outgoing)[peer]
        except PeerLost:  # lost before it sent its model: this worker sits the round out
            return
        theirs = decode_buffer(ctx.compressor, incoming, mine, peer)
        my_score = ctx.score()
        assign(params, theirs)
        if my_score <= ctx.score():  # ours wins (lower loss): put it back
            assign(params, mine)
            state["wins"] += 1

    def donate(self, state: dict[str, Any]) -> dict[str, Any]:
        """A worker joins in a lost one's place from this one's model (run.rejoin): the
        rounds it has won are this worker's, not its."""
        return {**state, "wins": torch.zeros_like(state["wins"])}

    def close(self) -> None:
        return None


def pairing(world_size: int, round_: int) -> dict[int, int]:
    """A random perfect matching for this round (one worker sits out when n is odd)."""
    order = random.Random(round_).sample(range(world_size), world_size)
    pairs = {}
    for a, b in zip(order[0::2], order[1::2]):
        pairs[a], pairs[b] = b, a
    return pairs
