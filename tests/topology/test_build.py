"""Communication graphs and mixing weights (fastsgd.topology.build)."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from fastsgd.errors import UserError
from fastsgd.topology import build as topology
from fastsgd.topology import graphs
from fastsgd.topology.build import (
    CLI_KEYS,
    TOPOLOGIES,
    Topology,
    build_topology,
    cli_key,
    config_key,
    parse_edges,
)
from fastsgd.topology.show import ARROWS, EDGES, describe, draw


def nbrs(t: Topology, step: int = 0) -> list[set[int]]:
    return [set(t.out_neighbors(i, step)) for i in range(t.n)]


def connected(t: Topology) -> bool:
    seen, todo = {0}, [0]
    while todo:
        for j in t.out_neighbors(todo.pop()):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == t.n


def test_ring_and_small_rings():
    assert nbrs(build_topology("ring", 5)) == [{1, 4}, {0, 2}, {1, 3}, {2, 4}, {3, 0}]
    assert nbrs(build_topology("ring", 2)) == [{1}, {0}]
    one = build_topology("ring", 1)
    assert nbrs(one) == [set()] and one.weights(0) == [(0, 1.0)]
    assert one.spectral_gap() == 1.0


def test_torus_4x4_has_four_distinct_neighbours():
    t = build_topology("torus", 16)
    assert (t.rows, t.cols) == (4, 4)
    assert all(len(s) == 4 for s in nbrs(t))
    assert nbrs(t)[0] == {1, 3, 4, 12}
    assert nbrs(t)[5] == {1, 4, 6, 9}
    assert not t.directed and not t.time_varying


def test_torus_2x3_dedupes_the_short_side():
    t = build_topology("torus", 6, rows=2, cols=3)
    # rank = r * 3 + c; rows of 2 give a single vertical neighbour
    assert nbrs(t) == [{1, 2, 3}, {0, 2, 4}, {0, 1, 5}, {0, 4, 5}, {1, 3, 5}, {2, 3, 4}]


@pytest.mark.parametrize("n, rows, cols, shape", [
    (16, 0, 0, (4, 4)), (8, 0, 0, (2, 4)), (12, 0, 0, (3, 4)), (8, 4, 0, (4, 2)),
    (8, 0, 2, (4, 2)), (6, 3, 2, (3, 2)),
])
def test_torus_shape_inference(n, rows, cols, shape):
    t = build_topology("torus", n, rows=rows, cols=cols)
    assert (t.rows, t.cols) == shape


@pytest.mark.parametrize("n, kw, words", [
    (7, {}, ["7 workers", "strategy.rows", "6 or 8", '"ring"']),
    (2, {}, ["strategy.rows", "e.g. 4 workers"]),
    (8, {"rows": 2, "cols": 3}, ["strategy.rows x strategy.cols = 2 x 3 = 6", "8 workers"]),
    (8, {"rows": 3}, ["strategy.rows = 3", "8 workers"]),
    (8, {"rows": 1, "cols": 8}, ["both sides >= 2"]),
    (8, {"cols": -1}, ["both sides >= 2"]),
    (8, {"rows": -2, "cols": -4}, ["both sides >= 2"]),
])
def test_torus_errors(n, kw, words):
    with pytest.raises(UserError) as e:
        build_topology("torus", n, **kw)
    assert all(w in str(e.value) for w in words), str(e.value)


# A lone worker (the base of a bench's scaling curve) is plain SGD on any topology.
@pytest.mark.parametrize("name", [n for n in TOPOLOGIES if n != "custom"])
def test_a_lone_worker_has_no_neighbours_on_any_topology(name):
    t = build_topology(name, 1)
    assert nbrs(t) == [set()] and t.weights(0, 0) == [(0, 1.0)]


def test_star_hypercube_exponential():
    assert nbrs(build_topology("star", 4)) == [{1, 2, 3}, {0}, {0}, {0}]
    assert nbrs(build_topology("hypercube", 8))[5] == {4, 7, 1}
    assert all(len(s) == 3 for s in nbrs(build_topology("hypercube", 8)))
    assert nbrs(build_topology("exponential", 8))[0] == {1, 2, 4, 6, 7}
    assert nbrs(build_topology("exponential", 6))[0] == {1, 2, 4, 5}
    assert nbrs(build_topology("complete", 4))[2] == {0, 1, 3}


@pytest.mark.parametrize("name, weighting", [
    (n, w) for n in TOPOLOGIES if n != "custom" for w in ("uniform", "metropolis")
    if (n, w) != ("onepeer", "metropolis")])  # metropolis needs an undirected graph
def test_weights_rows_sum_to_one_and_match_matrix(name, weighting):
    t = build_topology(name, 8, weighting=weighting)
    w = t.matrix()
    assert w.dtype == torch.float64 and w.shape == (8, 8)
    for i in range(8):
        row = t.weights(i)
        assert {j for j, _ in row} == {i, *t.in_neighbors(i)}
        assert all(x >= 0 for _, x in row) and math.isclose(sum(x for _, x in row), 1.0)
        assert all(w[i, j] == x for j, x in row)
    assert torch.allclose(w.sum(1), torch.ones(8, dtype=torch.float64))
    assert connected(t)


@pytest.mark.parametrize("name, n", [("ring", 7), ("torus", 16), ("hypercube", 8),
                                     ("exponential", 8), ("complete", 5)])
def test_uniform_on_regular_graphs_is_doubly_stochastic(name, n):
    t = build_topology(name, n)
    w = t.matrix()
    assert t.is_doubly_stochastic() and torch.allclose(w, w.T)


def test_metropolis_star_and_random_doubly_stochastic_and_symmetric():
    for t in (build_topology("star", 6, weighting="metropolis"),
              build_topology("random", 10, degree=3, weighting="metropolis")):
        w = t.matrix()
        assert t.is_doubly_stochastic() and torch.allclose(w, w.T)
    star = build_topology("star", 6, weighting="metropolis")
    assert star.weights(1) == [(0, 1 / 6), (1, 5 / 6)]


def test_uniform_star_is_not_doubly_stochastic():
    t = build_topology("star", 6)
    assert not t.is_doubly_stochastic()
    assert t.weights(0) == [(i, 1 / 6) for i in range(6)]
    assert t.weights(3) == [(0, 0.5), (3, 0.5)]
    assert 0 < t.spectral_gap() <= 1


def test_spectral_gap_complete_and_ring():
    t = build_topology("complete", 6)
    assert torch.allclose(t.matrix(), torch.full((6, 6), 1 / 6, dtype=torch.float64))
    assert t.spectral_gap() == pytest.approx(1.0)
    for n in (5, 8, 12):
        ring = build_topology("ring", n)
        expected = (1 + 2 * math.cos(2 * math.pi / n)) / 3
        assert ring.second_eigenvalue() == pytest.approx(expected)
        assert ring.spectral_gap() == pytest.approx(1 - expected)


def test_onepeer_is_time_varying_directed_and_doubly_stochastic():
    t = build_topology("onepeer", 8)
    assert t.time_varying and t.directed and t.period == 3
    assert [t.out_neighbors(3, s) for s in range(4)] == [[4], [5], [7], [4]]
    assert [t.in_neighbors(3, s) for s in range(3)] == [[2], [1], [7]]
    for s in range(3):
        w = t.matrix(s)
        assert t.weights(0, s) == sorted([(0, 0.5), (t.in_neighbors(0, s)[0], 0.5)])
        ones = torch.ones(8, dtype=torch.float64)
        assert torch.allclose(w.sum(0), ones) and torch.allclose(w.sum(1), ones)
        assert t.is_doubly_stochastic(s)
    assert build_topology("onepeer", 5).period == 3
    assert nbrs(build_topology("onepeer", 1)) == [set()]
    assert not build_topology("onepeer", 2).time_varying


def test_random_regular_connected_seeded():
    t = build_topology("random", 12, degree=3, seed=1)
    assert all(len(s) == 3 for s in nbrs(t)) and connected(t) and not t.directed
    assert t == build_topology("random", 12, degree=3, seed=1)
    assert nbrs(t) != nbrs(build_topology("random", 12, degree=3, seed=2))
    ring = build_topology("random", 9, degree=2, seed=3)
    assert all(len(s) == 2 for s in nbrs(ring)) and connected(ring)
    auto = build_topology("random", 7)
    assert all(len(s) == 4 for s in nbrs(auto))
    assert all(len(s) == 2 for s in nbrs(build_topology("random", 3)))


@pytest.mark.parametrize("n, degree", [(5, 3), (4, 4), (6, -1), (6, 1)])
def test_random_errors(n, degree):
    with pytest.raises(UserError, match="strategy.degree"):
        build_topology("random", n, degree=degree)


def test_custom_edges():
    t = build_topology("custom", 4, edges=[[0, 1], [1, 2], [2, 3], [3, 0], [0, 1]])
    assert nbrs(t) == [{1, 3}, {0, 2}, {1, 3}, {0, 2}]
    assert build_topology("custom", 1, edges=[]).weights(0) == [(0, 1.0)]


@pytest.mark.parametrize("edges, words", [
    (None, "strategy.edges"), ([[0, 5]], "strategy.edges[0]"), ([[0, 1], [2, 2]], "edges[1]"),
    ([[0, 1, 2]], "edges[0]"), ([[0, "a"]], "edges[0]"), ([[0, True]], "edges[0]"),
    ([[0, 1], [2, 3]], "connect"),
])
def test_custom_errors(edges, words):
    with pytest.raises(UserError, match=words.replace("[", r"\[")):
        build_topology("custom", 4, edges=edges)


def test_other_errors():
    with pytest.raises(UserError, match=r"unknown topology 'mesh' \(strategy.topology\)"):
        build_topology("mesh", 4)
    with pytest.raises(UserError, match="strategy.weights"):
        build_topology("ring", 4, weighting="max")
    with pytest.raises(UserError, match="strategy.weights.*directed"):
        build_topology("onepeer", 4, weighting="metropolis")
    with pytest.raises(UserError,
                       match='strategy.topology = "hypercube" needs.*got run.workers = 6'):
        build_topology("hypercube", 6)
    with pytest.raises(UserError, match="at least 1 worker"):
        build_topology("ring", 0)


def test_config_keys_are_the_default():
    assert config_key("graph_seed") == "strategy.graph_seed"
    with pytest.raises(UserError, match="strategy.rows = 3 does not divide 8 workers"):
        build_topology("torus", 8, rows=3)
    with pytest.raises(UserError, match=r"set strategy.edges = \[\[a, b\], \.\.\.\]"):
        build_topology("custom", 4)
    with pytest.raises(UserError, match=r"\(strategy.degree, strategy.graph_seed\)"):
        _unlucky_random(config_key)


def _unlucky_random(keys: topology.Keys) -> None:
    """A random graph whose every draw of stubs fails."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graphs, "_pair_stubs", lambda *_: None)
        build_topology("random", 8, degree=3, keys=keys)


def test_cli_key_names_every_option():
    assert set(CLI_KEYS) == {"topology", "weights", "rows", "cols", "degree", "graph_seed",
                             "edges", "workers"}
    assert [cli_key(k) for k in ("topology", "graph_seed", "rows")] == ["topology", "--seed",
                                                                       "--rows"]
    assert graphs.said("topology", "ring") == "topology ring"
    assert graphs.said("strategy.topology", "ring") == 'strategy.topology = "ring"'


@pytest.mark.parametrize("name, n, kw, words", [
    ("torus", 7, {}, ["(--rows, --cols)", "6 or 8 workers", "or topology ring"]),
    ("torus", 8, {"rows": 3}, ["torus: --rows 3 does not divide 8 workers"]),
    ("torus", 8, {"cols": 3}, ["--cols 3"]),
    ("torus", 8, {"rows": 2, "cols": 3}, ["--rows x --cols = 2 x 3 = 6"]),
    ("torus", 8, {"rows": 1, "cols": 8}, ["--rows x --cols = 1 x 8", "use topology ring"]),
    ("random", 5, {"degree": 3}, ["random: --degree 3 does not"]),
    ("custom", 4, {}, ["set --edges 0-1,1-2,..."]),
    ("custom", 4, {"edges": [[0, 1], [1, 5]]}, ["--edges item 1-5 must be a-b", "0..3"]),
    ("custom", 4, {"edges": [[0, 1], [2, 2]]}, ["--edges item 2-2"]),
    ("custom", 4, {"edges": [[0, 1], [2, 3]]}, ["--edges do not connect all 4 workers"]),
    ("mesh", 4, {}, ["unknown topology 'mesh'; choose one of"]),
    ("hypercube", 6, {}, ["topology hypercube needs a power-of-two", "got --workers 6"]),
    ("ring", 4, {"weighting": "max"}, ["'max' (--weights)"]),
    ("onepeer", 4, {"weighting": "metropolis"}, ["--weights metropolis needs an undirected",
                                                 "use --weights uniform"]),
])
def test_cli_keys_in_errors(name, n, kw, words):
    with pytest.raises(UserError) as e:
        build_topology(name, n, keys=cli_key, **kw)
    text = str(e.value)
    assert all(w in text for w in words), text
    assert "strategy." not in text and "\n" not in text and "NAME" not in text


def test_cli_keys_random_retries_name_seed():
    with pytest.raises(UserError, match=r"\(--degree, --seed\)"):
        _unlucky_random(cli_key)


def test_keys_can_be_any_callable():
    with pytest.raises(UserError, match=r"\[gossip\]\.rows = 3"):
        build_topology("torus", 8, rows=3, keys=lambda k: f"[gossip].{k}")


@pytest.mark.parametrize("text, edges", [
    ("0-1,1-2,2-3,3-0", [[0, 1], [1, 2], [2, 3], [3, 0]]),
    (" 0 - 1 , 1-2 ", [[0, 1], [1, 2]]),
    ("5-5", [[5, 5]]),  # parsed; build_topology rejects the self loop
    ("10-200", [[10, 200]]),
])
def test_parse_edges(text, edges):
    assert parse_edges(text) == edges


@pytest.mark.parametrize("text, item", [
    ("0-x", "'0-x'"), ("1", "'1'"), ("-", "'-'"), ("0-1,", "''"), ("0-1,,1-2", "''"),
    ("-1-2", "'-1-2'"), ("0-1-2", "'0-1-2'"), ("0:1", "'0:1'"), ("0-1.5", "'0-1.5'"),
])
def test_parse_edges_errors_name_the_item(text, item):
    with pytest.raises(UserError) as e:
        parse_edges(text)
    assert f"--edges: bad item {item}" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["", "   "])
def test_parse_edges_empty(text):
    with pytest.raises(UserError, match="--edges is empty"):
        parse_edges(text)


def test_custom_from_parsed_edges():
    t = build_topology("custom", 4, edges=parse_edges("0-1, 1-2, 2-3, 3-0"), keys=cli_key)
    assert nbrs(t) == [{1, 3}, {0, 2}, {1, 3}, {0, 2}] and t.is_doubly_stochastic()
    assert t == build_topology("custom", 4, edges=[[0, 1], [1, 2], [2, 3], [3, 0]])
    with pytest.raises(UserError, match="--edges item 3-4"):
        build_topology("custom", 4, edges=parse_edges("0-1,1-2,2-3,3-4"), keys=cli_key)


def test_topology_is_picklable():
    t = build_topology("torus", 8, weighting="metropolis")
    u = pickle.loads(pickle.dumps(t))
    assert u == t and u.weights(3) == t.weights(3) and u.directed == t.directed


def test_describe_mentions_spectral_gap():
    text = describe(build_topology("ring", 4))
    assert "spectral gap 0.6667" in text and "doubly stochastic" in text
    assert "   1: 0(0.3333) self(0.3333) 2(0.3333)" in text.splitlines()
    assert "not doubly stochastic" in describe(build_topology("star", 5))
    assert "step 1" in describe(build_topology("onepeer", 8), step=1)


@pytest.mark.parametrize("name, n, step", [("torus", 16, 0), ("onepeer", 8, 1)])
def test_draw_writes_png(tmp_path, name, n, step):
    path = tmp_path / f"{name}.png"
    draw(build_topology(name, n), path, step=step)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def _eigvals_reference(t: Topology, step: int) -> float:
    mags = torch.sort(torch.linalg.eigvals(t.matrix(step)).abs(), descending=True).values
    return min(1.0, float(mags[1])) if t.n > 1 else 0.0


@pytest.mark.parametrize("name, n, kw", [
    ("star", 9, {}), ("star", 9, {"weighting": "metropolis"}), ("ring", 6, {}),
    ("torus", 12, {}), ("random", 10, {"degree": 3}), ("exponential", 6, {}),
    ("custom", 5, {"edges": [[0, 1], [1, 2], [2, 3], [3, 4], [1, 3]]}), ("onepeer", 8, {}),
    ("onepeer", 6, {}), ("complete", 1, {}),
])
def test_second_eigenvalue_agrees_with_a_general_eigensolver(name, n, kw):
    t = build_topology(name, n, **kw)
    for step in range(t.period):
        assert t.second_eigenvalue(step) == pytest.approx(_eigvals_reference(t, step), abs=1e-9)


def test_a_step_in_parts_has_a_gap_of_exactly_zero():
    t = build_topology("onepeer", 8)  # step 1 sends i -> i + 2: two cycles, never mixed
    assert t.spectral_gap(1) == 0.0 and t.second_eigenvalue(1) == 1.0
    assert "second eigenvalue 1.0000, spectral gap 0;" in describe(t, step=1)


@pytest.mark.parametrize("name, gap, second", [
    ("ring", "spectral gap 1.316e-05", "second eigenvalue 0.99998684,"),  # 2/3 (1 - cos 2pi/n)
    ("onepeer", "spectral gap 4.935e-06", "second eigenvalue 0.999995065,"),  # 1 - cos pi/n
])
def test_a_small_spectral_gap_is_printed_with_its_digits(name, gap, second):
    last = describe(build_topology(name, 1000)).splitlines()[-1]
    assert gap in last and second in last, last


def test_directed_is_kept_and_survives_pickling():
    t = build_topology("onepeer", 8)
    assert t.directed and not build_topology("ring", 8).directed
    assert pickle.loads(pickle.dumps(t)).directed


def _artists_drawn(monkeypatch: pytest.MonkeyPatch, t: Topology, step: int = 0) -> tuple:
    """(artists in the figure draw() saves, what draw() returns), without writing a PNG."""
    from matplotlib.figure import Figure

    seen = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: seen.append(len(fig.findobj())))
    left_out = draw(t, "unused.png", step)
    return seen[0], left_out


@pytest.mark.parametrize("name, n", [("complete", 100), ("onepeer", ARROWS + 1), ("ring", 2048),
                                     ("torus", 1024)])
def test_a_large_graph_is_drawn_with_few_artists(monkeypatch, name, n):
    artists, left_out = _artists_drawn(monkeypatch, build_topology(name, n))
    assert artists < 200 and left_out == 0  # ~90 of axes, one collection, no rank labels


def test_a_small_directed_graph_has_arrows_and_labels(monkeypatch):
    artists, _ = _artists_drawn(monkeypatch, build_topology("onepeer", 16), step=1)
    assert artists > 90 + 2 * 16  # an arrow and a label each


def test_a_graph_of_too_many_edges_is_drawn_without_them(monkeypatch):
    t = build_topology("complete", 400)  # 79800 edges
    assert 400 * 399 // 2 > EDGES
    artists, left_out = _artists_drawn(monkeypatch, t)
    assert left_out == 400 * 399 // 2 and artists < 200
