"""Decentralized gossip on an incomplete topology (the FAST paper's 2D torus, rings,
exponential graphs...): no worker ever sees all the others.

- `dpsgd`: synchronous decentralized parallel SGD (Lian et al. 2017). After its local
  optimizer step, each worker sends its parameters to its neighbours and replaces them by
  the mix sum_j W_ij x_j over its closed neighbourhood. With a doubly stochastic W the
  average of the replicas is preserved and the replicas contract toward it at the rate of
  W's second eigenvalue. On the wire: the whole parameter vector to each neighbour, every
  step.
"""

from __future__ import annotations

from typing import Any

import torch

from fastsgd.options import Option, at_least, one_of
from fastsgd.strategies.base import Context
from fastsgd.strategies.params import assign, flatten
from fastsgd.topology import TOPOLOGIES, Topology, build_topology

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


class _OnGraph:
    """A strategy that talks to the neighbours of a topology built for the world size."""

    OPTIONS: dict[str, Option] = TOPOLOGY_OPTIONS

    def __init__(self, topology: str = "ring", weights: str = "uniform", rows: int = 0,
                 cols: int = 0, degree: int = 0, graph_seed: int = 0,
                 edges: list | None = None):
        self.graph = dict(name=topology, weighting=weights, rows=rows, cols=cols,
                          degree=degree, seed=graph_seed, edges=edges or None)
        self.topology: Topology | None = None

    def check(self, world_size: int) -> None:
        """Fail early (before any process starts) if the graph cannot be built."""
        self.build(world_size)

    def build(self, world_size: int) -> Topology:
        g = dict(self.graph)
        return build_topology(g.pop("name"), world_size, **g)

    def init(self, params: Params, ctx: Context) -> dict[str, Any]:
        self.topology = self.build(ctx.transport.world_size)
        return {}

    def on_gradients(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        return None

    def close(self) -> None:
        return None


class DPSGD(_OnGraph):
    name = "dpsgd"

    def on_parameters(self, params: Params, state: dict[str, Any], ctx: Context) -> None:
        assert self.topology is not None
        assign(params, mix(flatten(params), self.topology, ctx))


def mix(local: torch.Tensor, topology: Topology, ctx: Context) -> torch.Tensor:
    """One synchronous gossip round: send `local` to the out-neighbours, return the weighted
    sum over the closed in-neighbourhood."""
    t, step = ctx.transport, ctx.step
    handles = [t.send(local, peer) for peer in topology.out_neighbors(t.rank, step)]
    mixed = torch.zeros_like(local)
    for peer, weight in topology.weights(t.rank, step):
        if peer == t.rank:
            mixed.add_(local, alpha=weight)
        else:
            received = torch.empty_like(local)
            t.recv(received, peer)
            mixed.add_(received, alpha=weight)
    for handle in handles:
        handle.wait()
    return mixed
