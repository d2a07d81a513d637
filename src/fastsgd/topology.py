"""Communication graphs and mixing weights for decentralized strategies (DESIGN.md §3): plain,
picklable data. D-PSGD (Lian et al. 2017), SGP and exponential graphs (Assran et al. 2019), the
2D torus of FAST (Viviani et al. 2019), Metropolis-Hastings weights (Xiao & Boyd 2004)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fastsgd.errors import UserError
from fastsgd.graphs import (
    Graph,
    Keys,
    custom_graph,
    invert,
    random_regular,
    said,
    torus_edges,
    torus_shape,
    undirected,
)

if TYPE_CHECKING:
    import torch

TOPOLOGIES = ("complete", "star", "ring", "torus", "hypercube", "exponential", "onepeer", "random",
              "custom")
WEIGHTINGS = ("uniform", "metropolis")
CLI_KEYS = {"topology": "NAME", "weights": "--weights", "rows": "--rows", "cols": "--cols",
            "degree": "--degree", "graph_seed": "--seed", "edges": "--edges"}


def config_key(name: str) -> str:
    """How the config file spells option `name` (TOPOLOGY_OPTIONS): strategy.rows, ..."""
    return f"strategy.{name}"


def cli_key(name: str) -> str:
    """How `fastsgd topology` spells option `name`: --rows, --seed, NAME (the positional)."""
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

    def __post_init__(self) -> None:
        _check_weighting(self.name, self.weighting, self.graphs, config_key)
        object.__setattr__(self, "_ins", tuple(invert(g) for g in self.graphs))

    @property
    def directed(self) -> bool:
        """True if some rank sends to a peer that does not send back (at some step)."""
        return self._ins != self.graphs

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

        rows = [[0.0] * self.n for _ in range(self.n)]
        for i in range(self.n):
            for j, wij in self.weights(i, step):
                rows[i][j] = wij
        return torch.tensor(rows, dtype=torch.float64)

    def is_doubly_stochastic(self, step: int = 0, tol: float = 1e-9) -> bool:
        """True if the columns of W sum to 1 as well as the rows (gossip preserves the mean)."""
        w = self.matrix(step)
        return bool((w >= 0).all() and ((w.sum(0) - 1).abs() <= tol).all())

    def second_eigenvalue(self, step: int = 0) -> float:
        """Second largest |eigenvalue| of W: the per-step contraction of consensus distance."""
        import torch

        w = self.matrix(step)
        symmetric = torch.allclose(w, w.T, atol=1e-12, rtol=0)
        mags = (torch.linalg.eigvalsh(w) if symmetric else torch.linalg.eigvals(w)).abs()
        return min(1.0, float(torch.sort(mags, descending=True).values[1])) if self.n > 1 else 0.0

    def spectral_gap(self, step: int = 0) -> float:
        """1 - second_eigenvalue(step); for time-varying graphs the gap of that one step."""
        return 1.0 - self.second_eigenvalue(step)


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
        raise UserError(f"topology = \"hypercube\" ({keys('topology')}) needs a power-of-two "
                        f"number of workers, got n = {n}")
    if name in edges_of:
        return (undirected(n, edges_of[name]()),)
    if name == "onepeer":
        return tuple(tuple(tuple({(i + p) % n} - {i}) for i in range(n)) for p in powers or [0])
    if name == "random":
        return (random_regular(n, degree, seed, keys),)
    return (custom_graph(n, edges, keys),)


def build_topology(name: str, n: int, *, rows: int = 0, cols: int = 0, degree: int = 0,
                   seed: int = 0, edges: list[list[int]] | None = None,
                   weighting: str = "uniform", keys: Keys = config_key) -> Topology:
    """The named topology on n workers with uniform or Metropolis-Hastings mixing weights.
    Errors name each setting as `keys(option)` does: config_key (strategy.rows) or cli_key."""
    if name not in TOPOLOGIES:
        raise UserError(f"unknown topology {name!r} ({keys('topology')}); "
                        f"choose one of: {', '.join(TOPOLOGIES)}")
    if not isinstance(n, int) or n < 1:
        raise UserError(f"topology '{name}' needs at least 1 worker, got n = {n!r}")
    shape = torus_shape(n, rows, cols, keys) if name == "torus" else (0, 0)
    graphs = _graphs(name, n, shape, degree, seed, edges, keys)
    _check_weighting(name, weighting, graphs, keys)
    return Topology(name, n, weighting, graphs, rows=shape[0], cols=shape[1])


def describe(topology: Topology, step: int = 0) -> str:
    """A text table of the mixing weights, one line per worker, and the spectral gap."""
    t = topology
    shape = f", {t.rows} x {t.cols}" if t.rows else ""
    period = f", period {t.period}, step {step}" if t.time_varying else ""
    lines = [f"topology {t.name} (n = {t.n}{shape}, weights {t.weighting}{period})"]
    for i in range(t.n):
        cells = [f"{'self' if j == i else j}({w:.4g})" for j, w in t.weights(i, step)]
        lines.append(f"{i:>4}: " + " ".join(cells))
    ds = "doubly stochastic" if t.is_doubly_stochastic(step) else "not doubly stochastic"
    lines.append(f"second eigenvalue {t.second_eigenvalue(step):.4f}, "
                 f"spectral gap {t.spectral_gap(step):.4f}; W is {ds}")
    return "\n".join(lines)


def draw(topology: Topology, path: str | Path, step: int = 0) -> None:
    """Save a PNG of the graph at `step`: a grid for the torus, a circle otherwise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, angle = topology, lambda i: math.pi / 2 - 2 * math.pi * i / topology.n
    pos = [(i % t.cols, -(i // t.cols)) if t.name == "torus" else
           (math.cos(angle(i)), math.sin(angle(i))) for i in range(t.n)]
    fig, ax = plt.subplots(figsize=(6, 6))
    for i in range(t.n):
        for j in t.out_neighbors(i, step):
            if t.directed or i < j:
                far = abs(pos[i][0] - pos[j][0]) + abs(pos[i][1] - pos[j][1]) > 1.01
                bend = 0.3 if t.name == "torus" and far else 0.0  # wrap-around edges
                ax.annotate("", xy=pos[j], xytext=pos[i], arrowprops=dict(
                    arrowstyle="-|>" if t.directed else "-", color="0.4", shrinkA=11, shrinkB=11,
                    connectionstyle=f"arc3,rad={bend}"))
    ax.scatter(*zip(*pos), s=400, c="white", edgecolors="black", zorder=2)
    for i, (x, y) in enumerate(pos):
        ax.text(x, y, str(i), ha="center", va="center", fontsize=8, zorder=3)
    ax.set(title=f"{t.name}, n = {t.n}{f', step {step}' * t.time_varying}, spectral gap "
           f"{t.spectral_gap(step):.3f}", aspect="equal", xmargin=0.15, ymargin=0.15)
    ax.axis("off")
    fig.savefig(path, dpi=100)
    plt.close(fig)
