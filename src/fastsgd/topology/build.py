"""Communication graphs and mixing weights for decentralized strategies (DESIGN.md §3): plain,
picklable data. D-PSGD (Lian et al. 2017), SGP and exponential graphs (Assran et al. 2019), the
2D torus of FAST (Viviani et al. 2019), Metropolis-Hastings weights (Xiao & Boyd 2004)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastsgd.errors import UserError
from fastsgd.topology.graphs import (
    Graph,
    Keys,
    custom_graph,
    invert,
    random_regular,
    said,
    torus_edges,
    torus_shape,
    typed,
    undirected,
)

if TYPE_CHECKING:
    import torch

TOPOLOGIES = ("complete", "star", "ring", "torus", "hypercube", "exponential", "onepeer", "random",
              "custom")
WEIGHTINGS = ("uniform", "metropolis")
CLI_KEYS = {"topology": "topology", "weights": "--weights", "rows": "--rows", "cols": "--cols",
            "degree": "--degree", "graph_seed": "--seed", "edges": "--edges",
            "workers": "--workers"}


def config_key(name: str) -> str:
    """How the config file spells option `name` (TOPOLOGY_OPTIONS): strategy.rows, ...;
    the workers are run.workers."""
    return "run.workers" if name == "workers" else f"strategy.{name}"


def cli_key(name: str) -> str:
    """How `fastsgd topology` spells option `name`: --rows, --seed, and `topology` for the
    positional NAME (said() gives `topology ring`, as the user typed it)."""
    return CLI_KEYS.get(name, name)


@dataclass(frozen=True)
class Topology:
    """Graphs of out-neighbours (`graphs[t % period]` is used at step t: one for a static
    topology, ceil(log2 n) for the one-peer exponential graph) and their mixing weights."""

    name: str
    n: int
    weighting: str
    graphs: tuple[Graph, ...]
    rows: int = 0
    cols: int = 0
    _ins: tuple[Graph, ...] = field(init=False, repr=False, compare=False)
    _directed: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_weighting(self.name, self.weighting, self.graphs, config_key)
        object.__setattr__(self, "_ins", tuple(invert(g) for g in self.graphs))
        object.__setattr__(self, "_directed", self._ins != self.graphs)  # asked once per edge

    @property
    def directed(self) -> bool:
        """True if some rank sends to a peer that does not send back (at some step)."""
        return self._directed

    @property
    def time_varying(self) -> bool:
        """True if the graph changes with the step (the one-peer exponential graph)."""
        return self.period > 1

    @property
    def period(self) -> int:
        """Number of steps after which the sequence of graphs repeats."""
        return len(self.graphs)

    def out_neighbors(self, rank: int, step: int = 0) -> list[int]:
        """Peers that `rank` sends to at `step` (never itself)."""
        return list(self.graphs[step % self.period][rank])

    def in_neighbors(self, rank: int, step: int = 0) -> list[int]:
        """Peers that `rank` receives from at `step` (never itself)."""
        return list(self._ins[step % self.period][rank])

    def weights(self, rank: int, step: int = 0) -> list[tuple[int, float]]:
        """Row `rank` of W as (peer, weight) pairs by peer, self included. uniform: 1/(in-degree
        + 1) each; metropolis: 1/(1 + max(d_i, d_j)), self 1 - sum (Xiao & Boyd 2004)."""
        ins = self.in_neighbors(rank, step)
        if self.weighting == "uniform":
            return sorted((j, 1.0 / (len(ins) + 1)) for j in [rank, *ins])
        g = self.graphs[step % self.period]
        pairs = [(j, 1.0 / (1 + max(len(g[rank]), len(g[j])))) for j in ins]
        return sorted(pairs + [(rank, 1.0 - sum(w for _, w in pairs))])

    def matrix(self, step: int = 0) -> torch.Tensor:
        """The n x n float64 mixing matrix: W[i, j] is the weight i gives to j's value."""
        import torch

        w = torch.zeros(self.n, self.n, dtype=torch.float64)
        for i in range(self.n):
            peers, values = zip(*self.weights(i, step))
            w[i, list(peers)] = torch.tensor(values, dtype=torch.float64)
        return w

    def is_doubly_stochastic(self, step: int = 0, tol: float = 1e-9) -> bool:
        """True if the columns of W sum to 1 as well as the rows (gossip preserves the mean)."""
        w = self.matrix(step)
        return bool((w >= 0).all() and ((w.sum(0) - 1).abs() <= tol).all())

    def second_eigenvalue(self, step: int = 0) -> float:
        """Second largest |eigenvalue| of W: the per-step contraction of consensus distance."""
        return _second_eigenvalue(self, step % self.period)

    def spectral_gap(self, step: int = 0) -> float:
        """1 - second_eigenvalue(step); for time-varying graphs the gap of that one step."""
        return 1.0 - self.second_eigenvalue(step)


@functools.lru_cache(maxsize=4)  # describe() and draw() ask for the same one
def _second_eigenvalue(topology: Topology, step: int) -> float:
    import torch

    if topology.n == 1:
        return 0.0
    w = topology.matrix(step)
    second = float(torch.sort(_magnitudes(w), descending=True).values[1])
    return 1.0 if second > 1 - 1e-10 else second  # nearer 1 is round-off: a graph in parts


def _magnitudes(w: torch.Tensor) -> torch.Tensor:
    """|eigenvalues| of W by a symmetric eigensolver where one applies, as on every topology
    here: W itself; D^1/2 W D^-1/2 for uniform weights on an undirected graph (W = D^-1 (A + I),
    D = 1 / diag W); sqrt eig(W W^T) for a normal W (the one-peer graph's 0.5 (I + P))."""
    import torch

    def symmetric(m: torch.Tensor) -> bool:
        return torch.allclose(m, m.T, atol=1e-12, rtol=0)

    if symmetric(w):
        return torch.linalg.eigvalsh(w).abs()
    root = w.diagonal().rsqrt()
    similar = root[:, None].reciprocal() * w * root[None, :]
    if bool((w.diagonal() > 0).all()) and symmetric(similar):
        return torch.linalg.eigvalsh(similar).abs()
    gram = w @ w.T
    if torch.allclose(gram, w.T @ w, atol=1e-12, rtol=0):
        return torch.linalg.eigvalsh(gram).clamp(min=0).sqrt()
    return torch.linalg.eigvals(w).abs()


def _check_weighting(name: str, weighting: str, graphs: tuple[Graph, ...], keys: Keys) -> None:
    key = keys("weights")
    if weighting not in WEIGHTINGS:
        raise UserError(f"unknown mixing weights {weighting!r} ({key}); "
                        f"choose one of: {', '.join(WEIGHTINGS)}")
    if weighting == "metropolis" and any(invert(g) != g for g in graphs):
        raise UserError(f"{said(key, 'metropolis')} needs an undirected graph, but topology "
                        f"'{name}' is directed; use {said(key, 'uniform')}")


def parse_edges(text: str) -> list[list[int]]:
    """The command line's edge list "0-1,1-2,2-3" (spaces allowed) as [[0, 1], [1, 2], [2, 3]]."""
    key, eg = CLI_KEYS["edges"], "write undirected edges a-b between ranks, e.g. 0-1,1-2,2-0"
    if not text.strip():
        raise UserError(f"{key} is empty; {eg}")
    edges = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*", item)
        if m is None:
            raise UserError(f"{key}: bad item {item.strip()!r} in {text!r}; {eg}")
        edges.append([int(m[1]), int(m[2])])
    return edges


def _graphs(name: str, n: int, shape: tuple[int, int], degree: int, seed: int,
            edges: list[list[int]] | None, keys: Keys) -> tuple[Graph, ...]:
    powers = [1 << k for k in range(max(1, (n - 1).bit_length())) if 1 << k < n]
    edges_of = {
        "complete": lambda: [(i, j) for i in range(n) for j in range(i)],
        "star": lambda: [(0, i) for i in range(n)],
        "ring": lambda: [(i, (i + 1) % n) for i in range(n)],
        "torus": lambda: torus_edges(*shape),
        "hypercube": lambda: [(i, i ^ p) for i in range(n) for p in powers],
        "exponential": lambda: [(i, (i + p) % n) for i in range(n) for p in powers],
    }
    if name == "hypercube" and n & (n - 1):
        raise UserError(f"{said(keys('topology'), 'hypercube')} needs a power-of-two number of "
                        f"workers, got {said(keys('workers'), n)}")
    if name in edges_of:
        return (undirected(n, edges_of[name]()),)
    if name == "onepeer":
        return tuple(tuple(tuple({(i + p) % n} - {i}) for i in range(n)) for p in powers or [0])
    if name == "random":
        return (random_regular(n, degree, seed, keys),)
    return (custom_graph(n, edges, keys),)


ONLY_FOR = {"rows": "torus", "cols": "torus", "degree": "random", "graph_seed": "random",
            "edges": "custom"}


def check_applies(name: str, given: dict[str, object], keys: Keys = config_key) -> None:
    """UserError for an option `given` (not None) that topology `name` does not use:
    `rows` on a ring would be ignored."""
    for option, only in ONLY_FOR.items():
        if given.get(option) is not None and name in TOPOLOGIES and name != only:
            raise UserError(f"{keys(option)} is for topology {only}; "
                            f"{said(keys('topology'), name)} does not use it")


def build_topology(name: str, n: int, *, rows: int = 0, cols: int = 0, degree: int = 0,
                   seed: int = 0, edges: list[list[int]] | None = None,
                   weighting: str = "uniform", keys: Keys = config_key) -> Topology:
    """The named topology on n workers with uniform or Metropolis-Hastings mixing weights.
    Errors name each setting as `keys(option)` does: config_key (strategy.rows) or cli_key."""
    if name not in TOPOLOGIES:
        where = "" if typed(keys("topology")) else f" ({keys('topology')})"
        raise UserError(f"unknown topology {name!r}{where}; "
                        f"choose one of: {', '.join(TOPOLOGIES)}")
    if not isinstance(n, int) or n < 1:
        raise UserError(f"topology '{name}' needs at least 1 worker, got n = {n!r}")
    shape = torus_shape(n, rows, cols, keys) if name == "torus" else (0, 0)
    graphs = _graphs(name, n, shape, degree, seed, edges, keys)
    _check_weighting(name, weighting, graphs, keys)
    return Topology(name, n, weighting, graphs, rows=shape[0], cols=shape[1])
