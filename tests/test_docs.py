"""The user docs hold what they promise: every `fastsgd` command in a shell block of README.md
and docs/ parses, every `--set` key exists (`fastsgd keys`), the short commands run as
written, every relative link and anchor resolves, the README stays short, and dated figures
live only in the generated results pages (docs/results/, docs/experiments.md), each of whose
tables is headed by the command, machine, commit and date that produced it."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
GENERATED = {DOCS / "experiments.md"}  # written by experiments/make_docs.py
GUIDES = [ROOT / "README.md"] + sorted(p for p in DOCS.glob("*.md") if p not in GENERATED)
PAGES = GUIDES + sorted(GENERATED) + sorted(RESULTS.glob("*.md"))
SHELL_FENCE = re.compile(r"^```(bash|sh|console)\n(.*?)^```", re.S | re.M)
HEADER = "| command | machine | commit | date |"


def shell_lines(text: str) -> list[str]:
    """The logical lines of a page's shell blocks (backslash continuations joined)."""
    lines = []
    for block in SHELL_FENCE.finditer(text):
        lines += block.group(2).replace("\\\n", " ").splitlines()
    return lines


def fastsgd_commands(line: str) -> list[list[str]]:
    """The argument lists of every `fastsgd ...` (or `-m fastsgd ...`) a shell line runs."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens, commands, current = list(lexer), [], []
    for token in tokens + [";"]:
        if token in {";", "&&", "||", "|", "&", ">", "2>&1"} or set(token) <= set(";&|<>()"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    found = []
    for words in commands:
        for at, word in enumerate(words):
            if word == "fastsgd" and (at == 0 or words[at - 1] in {"-m", "do", "then"}):
                found.append(words[at + 1:])
                break
    return found


def inline_commands(text: str) -> list[str]:
    """`fastsgd ...` spans in a guide's prose (outside code blocks). A span that only names a
    command or an option (`fastsgd report`, `fastsgd bench --ray`) is left out."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    spans = re.findall(r"`((?:fastsgd|torchrun) [^`\n]*)`", prose.replace("\n", " "))
    return [span for span in spans if any(not word.startswith("-") for word in span.split()[2:])]


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        lines = shell_lines(text) + (inline_commands(text) if page in GUIDES else [])
        found += [(f"{page.relative_to(ROOT)}: {line.strip()}", args) for line in lines
                  for args in fastsgd_commands(line)]
    return found


COMMANDS = documented_commands()


@pytest.fixture(scope="module")
def known_keys() -> set[str]:
    """Every key `fastsgd keys` prints: section.key, strategies' and codecs' options too."""
    done = subprocess.run([sys.executable, "-m", "fastsgd", "keys"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    keys, section = set(), ""
    for line in done.stdout.splitlines():
        if line.startswith("["):
            section = line.strip("[] ")
        elif line.startswith("  ") and line.strip() and not line.strip().startswith("name ="):
            keys.add(f"{section}.{line.split()[0]}")
    assert {"run.workers", "strategy.topology", "compression.ratio"} <= keys
    return keys


def test_the_docs_have_commands_to_check():
    subcommands = {args[0] for _, args in COMMANDS if args}
    assert {"run", "simulate", "bench", "report", "pack", "keys", "topology"} <= subcommands


@pytest.mark.parametrize("where,args", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_documented_command_parses(where, args, monkeypatch, capsys):
    import fastsgd.cli.main as cli

    seen = []
    monkeypatch.setattr(cli, "_dispatch", lambda parsed: seen.append(parsed) or 0)
    try:
        assert cli.main(args) == 0, where
    except SystemExit as e:  # argparse's way of refusing
        pytest.fail(f"{where}: exit {e.code}: {capsys.readouterr().err.strip()[-300:]}")
    assert seen, where


@pytest.mark.parametrize("where,args", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_set_key_exists(where, args, known_keys):
    for at, word in enumerate(args[:-1]):
        if word == "--set":
            key = args[at + 1].split("=", 1)[0]
            assert key in known_keys, f"{where}: --set {key} is no key of `fastsgd keys`"


def short(args: list[str]) -> bool:
    """Seconds to run as written: keys, topology, or a simulation of digits in few steps."""
    if args[:1] in (["keys"], ["topology"], ["--version"]):
        return True
    sets = dict(a.split("=", 1) for a in args[1:] if "=" in a)
    return (args[:1] == ["simulate"] and sets.get("data.name") in {"digits", "synthetic"}
            and 0 < int(sets.get("run.steps", "0")) <= 100)


SHORT = [(where, args) for where, args in COMMANDS if short(args)]


def test_some_commands_are_short_enough_to_run():
    assert {args[0] for _, args in SHORT} >= {"keys", "topology", "simulate"}


@pytest.mark.parametrize("where,args", SHORT, ids=[w for w, _ in SHORT])
def test_the_short_commands_run_as_written(where, args, tmp_path):
    done = subprocess.run([sys.executable, "-m", "fastsgd", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{where}\n{done.stderr[-2000:]}"
    assert done.stdout.strip(), where


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {slug(m) for m in re.findall(r"^#+ (.*)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    for link in links(page):
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_relative_to(ROOT), f"{page.name}: {link} leaves the repository"
        assert target.exists(), f"{page.name}: {link} does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target), f"{page.name}: no heading #{anchor} in {path}"


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first = shell_lines(text)[:2]
    assert [line.split("#")[0].strip() for line in first] == [
        "bash scripts/setup.sh && fastsgd demo", "bash scripts/setup.sh && python3 -m pytest -q"]


@pytest.mark.parametrize("page", GUIDES, ids=[str(p.relative_to(ROOT)) for p in GUIDES])
def test_no_guide_holds_dated_figures_or_a_development_machine(page):
    text = page.read_text()
    dated = [line for line in text.splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, f"{page.name}: dated lines belong in docs/results/: {dated[:3]}"
    for detail in ("/opt/wheels", "AMD EPYC", "this 2-core", "development machine"):
        assert detail not in text, f"{page.name}: {detail!r}"


@pytest.mark.parametrize("page", sorted(RESULTS.glob("*.md")),
                         ids=[p.name for p in sorted(RESULTS.glob("*.md"))])
def test_every_results_table_is_headed_by_command_machine_commit_date(page):
    if page.name == "README.md":
        return
    assert re.fullmatch(r"[a-z0-9-]+_[a-z0-9-]+_\d{8}\.md", page.name), page.name
    tables = re.findall(r"(?:^\|.*\n)+", re.sub(r"^```.*?^```", "", page.read_text(),
                                                  flags=re.S | re.M), re.M)
    assert tables and tables[0].startswith(HEADER), f"{page.name}: the first table is no header"
    row = tables[0].splitlines()[2]
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", row), f"{page.name}: no date in {row}"


def test_the_results_index_is_up_to_date():
    path = ROOT / "experiments" / "make_docs.py"
    spec = importlib.util.spec_from_file_location("make_docs", path)
    make_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_docs)
    index = (RESULTS / "README.md").read_text()
    assert index == make_docs.results_index(RESULTS), \
        "run python3 experiments/make_docs.py --index"
    for page in RESULTS.glob("*.md"):
        assert page.name == "README.md" or f"]({page.name})" in index


def test_the_guides_index_lists_every_guide():
    index = (DOCS / "README.md").read_text()
    for page in DOCS.glob("*.md"):
        assert page.name == "README.md" or f"]({page.name})" in index, page.name
