"""The graphs behind the topologies (topology.py), as out-neighbours per rank: the 2D torus
of FAST (Viviani et al. 2019), random regular graphs (Steger & Wormald 1999) and the user's
own edge lists, each checked with errors that name the setting as the user wrote it."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from itertools import count

from fastsgd.errors import UserError

Graph = tuple[tuple[int, ...], ...]  # out-neighbours of each rank, sorted
Keys = Callable[[str], str]  # option name ("rows", "graph_seed", ...) -> what the user typed


def typed(key: str) -> bool:
    """True for a key typed on the command line: a flag (--rows), or the command word that comes
    before its positional (topology), rather than a config key (strategy.rows)."""
    return key.startswith("-") or key.isidentifier()


def said(key: str, value: object) -> str:
    """A setting as the user writes it: `--rows 3` (a flag), `topology ring` (the command and
    its positional), `strategy.rows = 3` or `strategy.weights = "uniform"` (a config key)."""
    if typed(key):
        return f"{key} {value}"
    return f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value}"


def invert(g: Graph) -> Graph:
    ins: list[list[int]] = [[] for _ in g]
    for i, outs in enumerate(g):
        for j in outs:
            ins[j].append(i)
    return tuple(tuple(sorted(x)) for x in ins)


def undirected(n: int, edges: list[tuple[int, int]] | list[list[int]]) -> Graph:
    """The simple undirected graph on n ranks with these edges (self loops, duplicates dropped)."""
    adj: list[set[int]] = [set() for _ in range(n)]
    for a, b in edges:
        if a != b:
            adj[a].add(b)
            adj[b].add(a)
    return tuple(tuple(sorted(s)) for s in adj)


def connected(g: Graph) -> bool:
    order, seen = [0], {0}
    for i in order:  # breadth-first; the list grows while we walk it
        order += [j for j in g[i] if j not in seen and not seen.add(j)]
    return len(seen) == len(g)


def torus_shape(n: int, rows: int, cols: int, keys: Keys) -> tuple[int, int]:
    """rows x cols for the 2D torus (Viviani et al. 2019); infer the most square grid if unset."""
    both = f"{keys('rows')} x {keys('cols')}"
    if n == 1 and not (rows or cols):  # a lone worker, as every topology allows: no neighbours
        return 1, 1
    if rows and cols and rows * cols != n:
        raise UserError(f"torus: {both} = {rows} x {cols} = {rows * cols}, but there are "
                        f"{n} workers")
    if bool(rows) != bool(cols):
        key, side = (keys("rows"), rows) if rows else (keys("cols"), cols)
        if n % side:
            raise UserError(f"torus: {said(key, side)} does not divide {n} workers")
        rows, cols = (rows, n // rows) if rows else (n // cols, cols)
    elif not rows:
        fits = lambda m: [r for r in range(2, math.isqrt(m) + 1) if m % r == 0]  # noqa: E731
        if not fits(n):
            low = next((m for m in range(n - 1, 3, -1) if fits(m)), None)
            high = next(m for m in count(n + 1) if fits(m))
            eg = f"{low} or {high}" if low else str(high)
            raise UserError(f"torus: {n} workers do not fit a rows x cols grid with both sides "
                            f">= 2 ({keys('rows')}, {keys('cols')}); choose e.g. {eg} workers, "
                            f"or {said(keys('topology'), 'ring')}")
        rows = fits(n)[-1]
        cols = n // rows
    if min(rows, cols) < 2 and n > 1:
        raise UserError(f"torus: {both} = {rows} x {cols} needs both sides >= 2; use "
                        f"{said(keys('topology'), 'ring')} for a single row")
    return rows, cols


def torus_edges(rows: int, cols: int) -> list[tuple[int, int]]:
    """Edges to (i±1, j), (i, j±1) modulo the sides, ranks row-major (Viviani et al. 2019)."""
    at = lambda r, c: (r % rows) * cols + c % cols  # noqa: E731
    cells = [(r, c) for r in range(rows) for c in range(cols)]
    return [(at(r, c), at(r + dr, c + dc)) for r, c in cells for dr, dc in ((1, 0), (0, 1))]


def random_regular(n: int, degree: int, seed: int, keys: Keys) -> Graph:
    """A simple connected `degree`-regular graph: random pairing of stubs, retried until simple
    and connected (Steger & Wormald 1999); degree 2 is a random Hamiltonian cycle."""
    if degree == 0:
        degree = min(4, n - 1) - (n * min(4, n - 1)) % 2
    if degree < 0 or degree >= n or n * degree % 2 or (degree == 1 and n > 2):
        raise UserError(f"random: {said(keys('degree'), degree)} does not give a connected "
                        f"regular graph on {n} workers; need 1 <= degree < n, n x degree even, and "
                        "degree >= 2 beyond 2 workers (0 = automatic)")
    rng = random.Random(seed)
    if degree == 2:
        order = rng.sample(range(n), n)
        return undirected(n, [(order[i], order[i - 1]) for i in range(n)])
    for _ in range(1000):
        g = _pair_stubs(n, degree, rng)
        if g is not None and connected(g):
            return g
    raise UserError(f"random: could not draw a connected {degree}-regular graph on {n} workers "
                    f"({keys('degree')}, {keys('graph_seed')})")


def _pair_stubs(n: int, degree: int, rng: random.Random) -> Graph | None:
    stubs = [i for i in range(n) for _ in range(degree)]
    adj: list[set[int]] = [set() for _ in range(n)]
    while stubs:
        for _ in range(100):
            a, b = rng.sample(range(len(stubs)), 2)
            u, v = stubs[a], stubs[b]
            if u != v and v not in adj[u]:
                break
        else:
            return None
        adj[u].add(v)
        adj[v].add(u)
        del stubs[max(a, b)], stubs[min(a, b)]
    return tuple(tuple(sorted(s)) for s in adj)


def custom_graph(n: int, edges: list[list[int]] | None, keys: Keys) -> Graph:
    """An undirected graph from an edge list [[a, b], ...]; it must be connected."""
    key = keys("edges")
    flag = key.startswith("-")  # the command line writes edges as 0-1,1-2 (parse_edges)
    if edges is None:
        how = f"{key} 0-1,1-2,..." if flag else f"{key} = [[a, b], ...]"
        raise UserError(f"custom: set {how} (undirected edges)")
    for k, e in enumerate(edges):
        ok = isinstance(e, (list, tuple)) and len(e) == 2
        if not ok or not all(type(x) is int and 0 <= x < n for x in e) or e[0] == e[1]:
            item = f"{key} item {_dashed(e)}" if flag else f"{key}[{k}] = {e!r}"
            form = "a-b" if flag else "[a, b]"
            raise UserError(f"custom: {item} must be {form} with two different ranks in "
                            f"0..{n - 1}")
    g = undirected(n, edges)
    if not connected(g):
        raise UserError(f"custom: {key} do not connect all {n} workers")
    return g


def _dashed(edge: object) -> str:
    """An edge as the command line writes it: [0, 5] -> 0-5."""
    return "-".join(map(str, edge)) if isinstance(edge, (list, tuple)) else repr(edge)
