"""Decentralized gossip on an incomplete topology (the FAST paper's 2D torus, rings,
exponential graphs...): no worker ever sees all the others.

- `dpsgd`: synchronous decentralized parallel SGD (Lian et al. 2017). After its local
  optimizer step, each worker sends its parameters to its neighbours and replaces them by
  the mix sum_j W_ij x_j over its closed neighbourhood. With a doubly stochastic W the
  average of the replicas is preserved and the replicas contract toward it at the rate of
  W's second eigenvalue. On the wire: the whole parameter vector to each neighbour, every
  step. With a lossy codec it becomes CHOCO-gossip (Koloskova et al. 2019): every worker
  keeps public copies x^_j of its closed neighbourhood, sends the compressed change
  q = C(x - x^_self), everyone adds q to their copy of the sender, and the worker moves by
  `gamma` * sum_j W_ij (x^_j - x^_self). The copies agree everywhere, so a symmetric W still
  preserves the average exactly; on the wire: the codec's payload to each neighbour.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from fastsgd.compress.base import Compressor
from fastsgd.compress.collectives import decode_buffer
from fastsgd.compress.wire import pack
from fastsgd.config.options import Option, at_least, between, one_of
from fastsgd.errors import UserError
from fastsgd.strategies.base import Context, StrategyBase
from fastsgd.strategies.capabilities import Capabilities
from fastsgd.strategies.membership import gone_at, healed_weights
from fastsgd.strategies.params import assign, flatten, mix_into
from fastsgd.topology.build import TOPOLOGIES, Topology, build_topology, check_applies
from fastsgd.transport.base import PeerLost

Params = list[torch.nn.Parameter]

TOPOLOGY_OPTIONS = {
    "topology": Option(str, "ring", one_of(TOPOLOGIES), "communication graph"),
    "weights": Option(str, "uniform", one_of(("uniform", "metropolis")), "mixing weights"),
    "rows": Option(int, 0, at_least(0), "torus rows (0: inferred)"),
    "cols": Option(int, 0, at_least(0), "torus columns (0: inferred)"),
    "degree": Option(int, 0, at_least(0), "random graph degree (0: min(4, n-1))"),
    "graph_seed": Option(int, 0, doc="seed of the random graph"),
    "edges": Option(list, [], doc="custom topology: [[a, b], ...] (undirected)"),
}

END_OPTIONS = {"average_at_end": Option(bool, True, doc="average the replicas after the "
                                        "final drain (false: each keeps its own)")}


@functools.lru_cache(maxsize=16)
def _shared_topology(key: tuple, world_size: int) -> Topology:
    """One Topology per graph for the whole process: simulated workers share it (a one-peer
    graph of 1024 workers is 1.5 MB; a Topology is never changed once built)."""
    graph = dict(key)
    edges = graph.pop("edges")
    return _topology({**graph, "edges": [e if isinstance(e, str) else list(e) for e in edges]
                      if edges else None},
                     world_size)


def _topology(graph: dict[str, Any], world_size: int) -> Topology:
    graph = dict(graph)
    return build_topology(graph.pop("name"), world_size, **graph)


class OnGraph(StrategyBase):
    """A strategy that talks to the neighbours of a topology built for the world size."""

    OPTIONS: dict[str, Option] = TOPOLOGY_OPTIONS

    def __init__(self, topology: str = "ring", weights: str = "uniform", rows: int = 0,
                 cols: int = 0, degree: int = 0, graph_seed: int = 0,
                 edges: list | None = None):
        set_off_default = {k: v or None for k, v in (("rows", rows), ("cols", cols),
                           ("degree", degree), ("graph_seed", graph_seed), ("edges", edges))}
        check_applies(topology, set_off_default)
        self.graph = dict(name=topology, weighting=weights, rows=rows, cols=cols,
                          degree=degree, seed=graph_seed, edges=edges or None)
        self.topology: Topology | None = None

    def check(self, world_size: int) -> None:
        """Fail early (before any process starts) if the graph cannot be built."""
        self.build(world_size)

    def build(self, world_size: int) -> Topology:
        edges = self.graph["edges"]
        try:
            frozen = tuple(e if isinstance(e, str) else tuple(e) for e in edges) if edges \
                else None  # (a string stays itself: custom_graph names it as written)
            key = tuple(sorted({**self.graph, "edges": frozen}.items()))
            hash(key)
        except TypeError:  # edges that are not [a, b] pairs: the graph says so, in one line
            return _topology(self.graph, world_size)
        return _shared_topology(key, world_size)

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        self.topology = self.build(ctx.transport.world_size)
        return {}

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def close(self) -> None:
        return None


class DPSGD(OnGraph):
    name = "dpsgd"
    capabilities = Capabilities(
        codec_kinds=("exact", "quantize", "sparse"),
        carries_on=("exact",),  # without lost workers (membership.py); CHOCO's copies do not
        carries_on_real=True,  # real rounds that disagree on when a worker left: exchange.py
        rejoins=("exact",))  # the graph reopens at the step a new worker joins at (roster.py)
    OPTIONS = {**TOPOLOGY_OPTIONS,
               "gamma": Option(float, 0.0, between(0, 1), "CHOCO step (lossy codecs only; 0: "
                               "from the codec's compression)")}

    def __init__(self, gamma: float = 0.0, **graph: Any):
        super().__init__(**graph)
        self.gamma = gamma

    def check_compression(self, codec: Compressor, world_size: int) -> None:
        topology = self.build(world_size)
        if codec.kind != "exact" and topology.time_varying:
            raise UserError(f"strategy.topology = '{topology.name}' changes every step; "
                            f"compressed gossip (compression.name = '{codec.name}') needs a "
                            "fixed graph")

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        super().init(params, ctx)
        assert self.topology is not None
        if ctx.compressor.kind == "exact":
            return {}
        self.check_compression(ctx.compressor, ctx.transport.world_size)
        start = flatten(params)  # every replica starts from the same parameters
        self._gamma = self.gamma or auto_gamma(ctx.compressor, start)
        peers = [p for p, _ in self.topology.weights(ctx.transport.rank)]
        return {"public": {peer: start.clone() for peer in peers}}

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        assert self.topology is not None
        if "public" in state:
            assign(params, choco(flatten(params), state["public"], self.topology, self._gamma,
                                 ctx))
        else:
            mix(params, self.topology, ctx)


def choco(local: torch.Tensor, public: dict[int, torch.Tensor], topology: Topology,
          gamma: float, ctx: Context) -> torch.Tensor:
    """One round of CHOCO-gossip: publish the compressed change, update the public copies,
    step toward the neighbours' copies."""
    t, codec, me = ctx.transport, ctx.compressor, ctx.transport.rank
    payload = pack(codec.compress(local - public[me]))
    senders = topology.in_neighbors(me)  # same codec, same shape: every payload's size
    incoming = t.exchange([(peer, payload) for peer in topology.out_neighbors(me)], senders,
                          payload)
    public[me] += decode_buffer(codec, payload, local, me)
    for peer in senders:
        public[peer] += decode_buffer(codec, incoming.pop(peer), local, peer)
    pull = sum(w * (public[peer] - public[me]) for peer, w in topology.weights(me))
    return local + gamma * pull


def mix(params: Params, topology: Topology, ctx: Context) -> None:
    """One synchronous gossip round: send the parameters to the out-neighbours, replace them
    by the weighted sum over the closed in-neighbourhood. Without the workers known to be
    lost (the graph closes around them, membership.py); a neighbour found lost during the
    exchange is replaced, and the exchange completed with its replacement."""
    t, step, local = ctx.transport, ctx.step, flatten(params)
    sent: set[int] = set()
    received: dict[int, torch.Tensor] = {}
    while True:
        gone = gone_at(t, step)
        weights = healed_weights(topology, t.rank, step, gone)
        outs = ([p for p in topology.out_neighbors(t.rank, step) if p not in gone]
                if topology.directed else [p for p, _ in weights if p != t.rank])
        sources = [p for p, _ in weights if p != t.rank and p not in received]
        try:
            received.update(t.exchange([(p, local) for p in outs if p not in sent], sources,
                                       local))
        except PeerLost as lost:
            received.update(lost.received)
            continue
        finally:
            sent.update(outs)
        break
    # summed in the order of `weights` straight into the parameters, tensor by tensor: the
    # terms are not to be changed (the simulator shares `local`, the flat copy sent, with
    # its receivers), and no model-sized vector to copy back. Only this worker's next step
    # reads the result: the simulator may compute it on a lane meanwhile (transport.defer)
    terms = [(local if peer == t.rank else received[peer], weight) for peer, weight in weights]
    t.defer(lambda: mix_into(params, terms))


def auto_gamma(codec: Compressor, like: torch.Tensor) -> float:
    """The consensus step of compressed gossip (dpsgd's CHOCO, sgp's pushes) when
    `strategy.gamma` is 0. CHOCO's step must shrink with the codec's quality delta
    (Koloskova et al. 2019); two measures of it, once, on a model-sized tensor, and the
    step is the smaller of 2.5 times the first and half the second, at most 0.5:
    - the bytes of its payload over the raw bytes (about 0.04 for topk at 2%, 0.04 for
      onebit and sign, 0.16 for qsgd): at 0.5 for every codec, dpsgd with topk at 1%
      diverged at 16 workers, and sgp with topk, dgc, onebit or sign collapsed with one
      worker 3x slower;
    - the share of a Gaussian tensor's energy that its decoded payload keeps, 1 -
      |C(x) - x|^2 / |x|^2 (0.144 for topk at 2%, randomk's ratio, 0.64 for onebit):
      randomk's payload carries no indices, so its bytes overstate its quality; at 2.5
      times its bytes sgp with randomk at 5% and 10% diverged, and dpsgd at 10% with the
      whole of its delta (docs/strategies.md).
    The random streams stay as they were."""
    with torch.random.fork_rng(devices=[like.device] if like.is_cuda else []):
        torch.manual_seed(0)  # seeds every GPU's generator too: this one's is restored
        x = torch.randn(like.numel(), dtype=like.dtype).to(like.device)
        payload = codec.compress(x)
        sent = pack(payload).numel()
        error = codec.decode(payload, x) - x
        kept = 1.0 - float(error.square().sum() / x.square().sum())
    by_bytes = 2.5 * sent / (like.numel() * like.element_size())
    return min(0.5, by_bytes, kept / 2) if kept > 0 else min(0.5, by_bytes)


Edge = tuple[int, int]  # the process at an edge's other end: (rank, the step it joined at)
EDGE_START = 25  # message tag: the model a new process's edge copies start from (run.rejoin)


def opens_late(own_since: int, edge: Edge) -> bool:
    """Does this edge join a process that took a lost one's place (run.rejoin)? Its copies
    cannot start from the model every replica started from: mid-run the live models are far
    from it, the first compressed changes would be large, and the receiver would mix in a
    model far from its own. So the sender sends its model exact once, and both ends' copies
    start from it (`send_start`, `take_start`)."""
    return bool(own_since or edge[1])


def send_start(t: Any, state: dict[str, Any], edges: str, edge: Edge,
               model: torch.Tensor) -> torch.Tensor:
    """Open a late edge from the sending end: its copy is `model`, sent exact."""
    t.post(model, edge[0], EDGE_START)
    state[edges][edge] = copy = state["start"].clone().copy_(model)
    return copy


def take_start(t: Any, state: dict[str, Any], edges: str, edge: Edge) -> torch.Tensor:
    """Open a late edge from the receiving end: its copy is the sender's model, taken from
    the message `send_start` sent before the edge's first compressed one."""
    model = t.take_from(EDGE_START, edge[0])
    state[edges][edge] = copy = state["start"].clone().copy_(model.view_as(state["start"]))
    return copy


def edge_copy(state: dict[str, Any], edges: str, edge: Edge) -> torch.Tensor:
    """The copy of the sender's (sgp) or requester's (adpsgd) parameters that both ends of
    an edge keep alike. An edge joins two processes: a new process in a lost one's place
    (run.rejoin) starts new edges, whose copies start, at both ends, from the parameters
    every replica started from (the lost process's stay: a message of it may still come)."""
    if edge not in state[edges]:
        state[edges][edge] = state["start"].clone()
    return state[edges][edge]
