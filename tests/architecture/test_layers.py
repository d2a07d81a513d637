"""The package's shape: no import cycle anywhere, no private name imported across modules, a
small public face at the top. The layer order itself is import-linter's contract in
pyproject.toml (`lint-imports`, run by .ci/run and by the last test here)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (.[test] extras)")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "fastsgd"
PUBLIC_FACE = {"__init__.py", "__main__.py", "cli", "job", "errors.py"}
# What is still to be untangled; each entry goes as its move lands, and none may be added.
KNOWN_CYCLES: list[set[str]] = []
KNOWN_PRIVATE: set[str] = set()


def _graph():
    sys.path.insert(0, str(ROOT / "src"))
    try:
        return grimp.build_graph("fastsgd", cache_dir=None)
    finally:
        sys.path.remove(str(ROOT / "src"))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_counting_every_import():
    """Function-level and TYPE_CHECKING imports count: a cycle through them is still a
    tangle a reader has to hold in mind."""
    graph = _graph()
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = [{m.removeprefix("fastsgd.") for m in c} for c in _cycles(edges)]
    assert [c for c in cycles if c not in KNOWN_CYCLES] == []


def test_no_module_imports_a_private_name_from_another():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastsgd"):
                offenders += [f"{path.relative_to(PACKAGE)} {a.name}"
                              for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert set(offenders) - KNOWN_PRIVATE == set()


def test_the_top_holds_only_the_public_face():
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert modules <= PUBLIC_FACE and len(modules) <= 5


def test_no_folder_is_a_flat_soup():
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]:
        if folder.name == "__pycache__":
            continue
        assert len(list(folder.glob("*.py"))) <= 20, f"{folder}: group its modules"


def test_tests_mirror_the_source_folders():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    missing = sorted(f for f in folders if not (ROOT / "tests" / f).is_dir())
    assert missing == []


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed "
                    "(pip install -e .[test])")
def test_the_layer_contract_holds():
    done = subprocess.run([shutil.which("lint-imports"), "--no-cache"], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
