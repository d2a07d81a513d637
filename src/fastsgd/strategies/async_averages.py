"""The averages the asynchronous gossips take, apart from when and with whom they take them:
sgp's push-sum (async_gossip.py) and adpsgd's pairwise average (pairwise.py).

Each keeps exactly what it averages whatever the codec loses, push-sum the mass of the
shares, a pair the sum of its two models: with a lossy codec both ends of an edge or pair
keep a copy of the sender's or requester's parameters (gossip.edge_copy) and move it alike,
by what the codec carried. With the exact codec the models themselves go on the wire and
nobody keeps copies.
"""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.compress.base import Compressor
from fastsgd.compress.collectives import decode_buffer
from fastsgd.compress.wire import pack
from fastsgd.strategies.gossip import Edge, edge_copy, opens_late, send_start, take_start
from fastsgd.strategies.params import flatten, mix_into

Params = list[torch.nn.Parameter]


def sent_copy(t: Any, state: dict[str, Any], edges: str, edge: Edge, own_since: int,
              model: torch.Tensor) -> torch.Tensor:
    """The copy at the sending end of `edge` (sgp's pusher, adpsgd's requester); an edge
    that opens late (gossip.opens_late) opens here, its copy `model`, sent exact."""
    if edge not in state[edges] and opens_late(own_since, edge):
        send_start(t, state, edges, edge, model)
    return edge_copy(state, edges, edge)


def taken_copy(t: Any, state: dict[str, Any], edges: str, edge: Edge,
               own_since: int) -> torch.Tensor:
    """The copy at the receiving end of `edge`; an edge that opens late opens here, its
    copy the model the sender sent exact (gossip.take_start)."""
    if edge not in state[edges] and opens_late(own_since, edge):
        take_start(t, state, edges, edge)
    return edge_copy(state, edges, edge)


def push_sum_in_place(t, params: Params, peers: list[Edge], share: torch.Tensor,
                      ready: list[tuple[Edge, dict[str, torch.Tensor]]],
                      state: dict[str, Any]) -> None:
    """Exact codec: the parameters become the de-biased model x / w, once the shares sent
    have left and those that came are added, computed as the convex combination it is,
    (w_kept z + sum_j w_j z_j) / w, in place and in the model's dtype (the weights in
    float64): no model-sized numerator, no copy back. w goes into `state`."""
    w = state["weight"].clone()
    for _ in peers:  # each peer got z and a share of w
        w -= share
    kept, came = w.clone(), []
    for _, payload in ready:  # exact: the sender's parameters, as they were
        came.append((payload["values"], payload["weight"]))
        w += payload["weight"]
    state["weight"] = w
    if not came:  # x / w is z itself
        return
    terms = [(None, float(kept / w)), *((values, float(weight / w)) for values, weight in came)]
    t.defer(lambda: mix_into(params, terms))  # read by the next step only: maybe on a lane


def push_sum(codec: Compressor, params: Params, peers: list[Edge], share: torch.Tensor,
             ready: list[tuple[Edge, dict[str, torch.Tensor]]],
             state: dict[str, Any]) -> torch.Tensor:
    """Lossy codecs: the de-biased model x / w, in float64, once the shares sent have left
    (x loses them as the changes since the edges' copies) and the shares that came are
    added; w goes into `state`. One float64 temporary (in-place products and sums), and
    the flat model the codec's decode is shaped like."""
    z, w = flatten(params), state["weight"].clone()
    x = flatten(params, torch.float64).mul_(state["weight"])
    for edge in peers:
        w -= share
        x.sub_(state["sent"][edge], alpha=float(share))
    for edge, payload in ready:
        weight = payload.pop("weight")
        del payload["number"]
        share_of = edge_copy(state, "received", edge).add_(codec.decode(payload, z))
        x.add_(share_of, alpha=float(weight))
        w += weight
    state["weight"] = w
    return x.div_(w)


def pair_request(codec: Compressor, x: torch.Tensor, copy: torch.Tensor | None,
                 rank: int) -> torch.Tensor:
    """What a requester sends: x itself (the exact codec, `copy` None), or x's change since
    the pair's copy, which then moves by what the codec carried, as the answerer's will."""
    if copy is None:  # x itself: no copy to keep
        return pack(codec.compress(x))
    payload = pack(codec.compress(x - copy))
    copy += decode_buffer(codec, payload, x, rank)
    return payload


def pair_answer(codec: Compressor, request: torch.Tensor, x: torch.Tensor,
                copy: torch.Tensor | None, src: int,
                rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The answerer's half of an exchange with `src`: the answer (d, half the way from x to
    the requester's parameters, which the request moves the pair's copy to, packed) and d as
    the requester will decode it. The answerer adds d; the copy loses it, as the requester's
    will."""
    theirs = decode_buffer(codec, request, x, src)
    if copy is not None:
        theirs = copy.add_(theirs)
    answer = pack(codec.compress((theirs - x) / 2))
    d = decode_buffer(codec, answer, x, rank)
    if copy is not None:
        copy -= d
    return answer, d


def pair_answered(codec: Compressor, answer: torch.Tensor, x: torch.Tensor,
                  copy: torch.Tensor | None, src: int) -> torch.Tensor:
    """The requester's half, once `src` answered: x less the d the answer carries, which
    the pair's copy loses too, as at the answerer's end."""
    d = decode_buffer(codec, answer, x, src)
    if copy is not None:
        copy -= d
    return x - d
