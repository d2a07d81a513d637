"""`fastsgd topology NAME --workers N`: a topology's table of mixing weights, its spectral gap
and a PNG drawing; the command's own checks (how many workers it shows, which options each
topology takes, where the drawing goes), each a one-line UserError."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from fastsgd.errors import UserError
from fastsgd.topology.build import (
    Topology,
    build_topology,
    check_applies,
    cli_key,
    parse_edges,
)

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.collections import LineCollection

MAX_WORKERS = 2048  # a table of n lines, a dense n x n matrix: the complete graph takes ~10 s


def show(name: str, workers: int, *, step: int, png: str | None, weights: str,
         edges: str | None, **graph: int | None) -> int:
    """The command: check its options, print the table, then write the drawing."""
    given = {**graph, "graph_seed": graph.get("seed"), "edges": edges}
    _check_options(name, workers, step, given)
    topo = build_topology(name, workers, **{k: v or 0 for k, v in graph.items()},
                          edges=None if edges is None else parse_edges(edges),
                          weighting=weights, keys=cli_key)
    path = _png(png or f"topology-{name}-{workers}.png")
    print(describe(topo, step), flush=True)
    try:
        left_out = draw(topo, path, step)
    except OSError as e:  # a read-only place, a folder of that name, /proc...
        raise UserError(f"--png {path}: cannot write it: {e.strerror or e}") from None
    print(f"drawing: {path}" + (f" (the ranks only: {left_out} edges are more than the "
                                f"{EDGES} it draws)" if left_out else ""))
    return 0


def _check_options(name: str, workers: int, step: int, given: dict[str, object]) -> None:
    if not 1 <= workers <= MAX_WORKERS:
        raise UserError(f"--workers {workers}: fastsgd topology shows 1 to {MAX_WORKERS} "
                        "workers")
    if step < 0:
        raise UserError(f"--step {step}: steps count from 0")
    check_applies(name, given, cli_key)


def _png(text: str) -> Path:
    png = Path(text)
    if png.suffix.lower() != ".png":  # checked here: matplotlib's errors are tracebacks
        raise UserError(f"--png {png}: the drawing is a PNG; give it a name ending in .png")
    if not png.parent.is_dir():
        raise UserError(f"--png {png}: no such folder {png.parent}")
    if png.is_dir():
        raise UserError(f"--png {png}: is a folder; give the drawing a file name")
    return png


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
    gap = t.spectral_gap(step)
    lines.append(f"second eigenvalue {t.second_eigenvalue(step):.{_decimals(gap)}f}, "
                 f"spectral gap {_figure(gap)}; W is {ds}")
    return "\n".join(lines)


def _figure(gap: float) -> str:
    """4 significant digits: 0.6667, 0.01234, 1.316e-05 (a gap that is small, not zero)."""
    return f"{gap:.4f}" if gap >= 0.1 else f"{gap:.4g}"


def _decimals(gap: float) -> int:
    """Decimals that show 4 digits of 1 - lambda: 0.9999868 is not 1.0000."""
    return 4 if gap <= 0 else min(16, max(4, 3 - math.floor(math.log10(gap))))


LABELS = 64  # up to this many workers the drawing numbers the ranks
ARROWS = 256  # up to this many directed edges are arrows; beyond, lines as for undirected ones
EDGES = 50_000  # beyond this many edges (the complete graph on 317) only the ranks are drawn


def draw(topology: Topology, path: str | Path, step: int = 0) -> int:
    """Save a PNG of the graph at `step`: a grid for the torus, a circle otherwise. The edges
    are one artist (arrows for a small directed graph), so it takes seconds; a graph of more
    than EDGES edges is drawn without them. Returns how many edges it left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, pos = topology, _positions(topology)
    fig, ax = plt.subplots(figsize=(6, 6))
    left_out = _draw_edges(ax, t, pos, step)
    small = t.n <= LABELS
    ax.scatter(*pos.T, s=400 if small else max(1.0, (600 / t.n) ** 2), c="white",
               edgecolors="black", linewidths=1.0 if small else 0.5, zorder=2)
    for i, (x, y) in enumerate(pos if small else []):
        ax.text(x, y, str(i), ha="center", va="center", fontsize=8, zorder=3)
    note = f"\n({left_out} edges, too many to draw)" if left_out else ""
    ax.set(title=f"{t.name}, n = {t.n}{f', step {step}' * t.time_varying}, spectral gap "
           f"{_figure(t.spectral_gap(step))}{note}", aspect="equal", xmargin=0.15,
           ymargin=0.15)
    ax.axis("off")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return left_out


def _draw_edges(ax: Axes, t: Topology, pos: np.ndarray, step: int) -> int:
    """Draw the edges at `step` on `ax`, or none if more than EDGES: how many are left out."""
    g = t.graphs[step % t.period]
    count = sum(map(len, g)) // (1 if t.directed else 2)
    if count > EDGES:
        return count
    pairs = [(i, j) for i, outs in enumerate(g) for j in outs if t.directed or i < j]
    if t.directed and count <= ARROWS:
        for i, j in pairs:
            ax.annotate("", xy=pos[j], xytext=pos[i], arrowprops=dict(
                arrowstyle="-|>", color="0.4", shrinkA=11, shrinkB=11))
    else:
        ax.add_collection(_edges(t, pos, pairs))
    return 0


def _positions(t: Topology) -> np.ndarray:
    """Where each rank is drawn: row-major on the torus's grid, else clockwise from the top."""
    import numpy as np

    i = np.arange(t.n)
    if t.name == "torus":
        return np.stack([i % t.cols, -(i // t.cols)], axis=1).astype(float)
    angle = np.pi / 2 - 2 * np.pi * i / t.n
    return np.stack([np.cos(angle), np.sin(angle)], axis=1)


def _edges(t: Topology, pos: np.ndarray, pairs: list[tuple[int, int]]) -> LineCollection:
    """The edges as one LineCollection; the torus's wrap-around edges bend (as arc3, rad 0.3)."""
    import numpy as np
    from matplotlib.collections import LineCollection

    ends = pos[np.array(pairs, dtype=int).reshape(-1, 2)]  # (edges, 2 ends, xy)
    lines: list[np.ndarray] | np.ndarray = ends
    if t.name == "torus":
        s = np.linspace(0, 1, 17)[:, None]
        bent = lambda a, b: (1 - s) ** 2 * a + 2 * s * (1 - s) * (  # noqa: E731
            (a + b) / 2 + 0.3 * np.array([b[1] - a[1], a[0] - b[0]])) + s ** 2 * b
        lines = [bent(a, b) if np.abs(a - b).sum() > 1.01 else np.array([a, b]) for a, b in ends]
    return LineCollection(lines, colors="0.4", linewidths=1.0 if len(pairs) <= 2000 else 0.2,
                          zorder=1)
