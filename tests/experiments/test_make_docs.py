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


def test_each_section_is_headed_by_command_machine_commit_and_date():
    make_docs = _make_docs()
    head = make_docs.header("`python3 experiments/make_docs.py --only nodes`", "a box, 2 cores",
                            make_docs.commit(), "2026-12-05")
    lines = head.splitlines()
    assert lines[0] == "| command | machine | commit | date |"
    assert make_docs.header_cells(lines + [""]) == [
        "`python3 experiments/make_docs.py --only nodes`", "a box, 2 cores", make_docs.commit(),
        "2026-12-05"]
    assert make_docs.commit() != "unknown"  # this checkout is a git repository
    assert make_docs.header_cells(["| a | b |", "|---|---|", "| 1 | 2 |"]) == []


def test_the_results_index_lists_every_page_with_its_machine_and_date(tmp_path):
    make_docs = _make_docs()
    (tmp_path / "codec-speed_box_20261205.md").write_text(
        "# Codec speed\n\n" + make_docs.header("`python3 b.py --x a\\|b`", "a box", "abc1234",
                                              "2026-12-05") + "\n| codec | GB/s |\n")
    (tmp_path / "old_box_20261101.md").write_text("# An old page without a header\n")
    (tmp_path / "README.md").write_text("stale")
    index = make_docs.results_index(tmp_path)
    assert "| [codec-speed_box_20261205.md](codec-speed_box_20261205.md) | Codec speed | " \
           "a box | 2026-12-05 |" in index
    assert "| [old_box_20261101.md](old_box_20261101.md) | An old page without a header |  |  |" \
           in index
    assert "stale" not in index and "README.md](README.md)" not in index
