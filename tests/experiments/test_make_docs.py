"""experiments/make_docs.py: `--only` remakes its sections and keeps the others, word for
word, in the order of ORDER."""

import importlib.util
from pathlib import Path

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


def _make_docs():
    spec = importlib.util.spec_from_file_location("make_docs", EXPERIMENTS / "make_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_remakes_its_sections_and_keeps_the_others(tmp_path, monkeypatch):
    make_docs = _make_docs()
    titles = {name: make_docs.title(name) for name in make_docs.ORDER}
    page = tmp_path / "experiments.md"
    page.write_text("# header\n\n" + "".join(
        f"## {titles[name]}\n\nold {name}\n| a | b |\n\n" for name in make_docs.ORDER))
    monkeypatch.setattr(make_docs, "DOCS", tmp_path)
    monkeypatch.setattr(make_docs, "section", lambda name, jobs: f"## {titles[name]}\n\nnew\n")
    monkeypatch.setattr("sys.argv", ["make_docs.py", "--only", "nodes"])
    make_docs.main()
    kept = make_docs.sections(page.read_text())
    assert list(kept) == [titles[name] for name in make_docs.ORDER]
    for name in make_docs.ORDER:
        body = "new" if name == "nodes" else f"old {name}\n| a | b |"
        assert kept[titles[name]] == f"## {titles[name]}\n\n{body}\n", name
