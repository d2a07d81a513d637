"""Regenerate docs/experiments.md: run every spec of experiments/ with `fastsgd bench`
(resumable: cells already in experiments/out/ are not rerun), then write each one's
tables and plots, with the hand-written reading from experiments/readings.md. Each section
is headed by the command, the machine, the commit and the date that made it. Then rewrite
docs/results/README.md, the index of every results page.

    python3 experiments/make_docs.py [--jobs 2] [--only scaling nodes]
    python3 experiments/make_docs.py --index      # only the index of docs/results/

With --only, the other sections are kept as the page has them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
from pathlib import Path

from fastsgd.bench import run_bench
from fastsgd.bench.runner import cell_dir, done, plan
from fastsgd.config.schema import read_toml
from fastsgd.report import load_run, write_report
from fastsgd.report.runs import RunData
from fastsgd.report.table import scaling_efficiency

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs"
ORDER = ("scaling", "scaling_long", "replicas", "nodes", "edge", "real_vs_sim")


def axes_of(run: RunData) -> dict[str, str]:
    """A cell's value on each axis, from its label ("strategy=dpsgd/torus run.workers=16")."""
    return dict(part.split("=", 1) for part in run.label.split())


def cell_text(run: RunData, efficiency: float | None) -> str:
    s = run.summary
    reached = (f"{s['time_to_target']:.1f} s" if s["time_to_target"] is not None
               else "not reached")
    rate = s["samples_per_second"] / 1e3
    text = f"{reached} · {s['final_accuracy']:.1%} · {rate:,.{0 if rate >= 10 else 1}f}k/s"
    return text + (f" · {efficiency:.0%}" if efficiency is not None and s["workers"] > 1
                   else "")


def pivot(runs: list[RunData], axes: list[str]) -> str:
    """Tables of rows by columns (a third axis, if any, makes one table per value)."""
    rows, cols, *page = axes
    out = []
    pages = _ordered(runs, page[0]) if page else [""]
    for value in pages:
        subset = [r for r in runs if not page or axes_of(r)[page[0]] == value]
        row_values = _ordered(subset, rows)
        col_values = _ordered(subset, cols)
        by = {(axes_of(r)[rows], axes_of(r)[cols]): r for r in subset}
        efficiency = dict(zip((r.path for r in runs), scaling_efficiency(runs)))
        if page:
            out.append(f"**{page[0]} = {value}**\n")
        out.append(f"| {rows} \\ {cols} | " + " | ".join(col_values) + " |")
        out.append("|---|" + "---|" * len(col_values))
        for rv in row_values:
            cells = [cell_text(by[rv, cv], efficiency[by[rv, cv].path]) if (rv, cv) in by
                     else "" for cv in col_values]
            out.append(f"| {rv} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _ordered(runs: list[RunData], axis: str) -> list[str]:
    seen: list[str] = []
    for r in runs:
        value = axes_of(r)[axis]
        if value not in seen:
            seen.append(value)
    return seen


def readings() -> dict[str, str]:
    """experiments/readings.md: '## name' then the reading of that experiment."""
    text = (HERE / "readings.md").read_text() if (HERE / "readings.md").exists() else ""
    parts = {}
    for block in text.split("\n## ")[1:]:
        name, _, body = block.partition("\n")
        parts[name.strip()] = body.strip()
    return parts


def section(name: str, jobs: int) -> str:
    spec_path = HERE / f"{name}.toml"
    doc = read_toml(spec_path).get("doc", {})
    out_dir = HERE / "out" / name
    run_bench(spec_path, out_dir, jobs=jobs, yes=True, quiet=True)
    root, matrix = plan(spec_path, out_dir, max_cells=10**6, yes=True)
    runs = [load_run(cell_dir(root, c)) for c in matrix if done(root, c)]
    write_report(runs, out_dir / "report", title=doc.get("title", name))
    lines = [f"## {doc.get('title', name)}", "", doc.get("question", ""), "",
             header(f"`python3 experiments/make_docs.py --only {name}`", machine(), commit(),
                    datetime.date.today().isoformat()),
             f"Spec: [experiments/{name}.toml](../experiments/{name}.toml), "
             f"{len(runs)} of {len(matrix)} cells. "
             "Each cell: time to "
             f"{runs[0].summary['target_accuracy']:.0%} on the run's clock · final accuracy · "
             "samples per second (all workers) · scaling efficiency, where a 1-worker run of "
             "the job is in the spec.", "", pivot(runs, doc["pivot"])]
    for plot in doc.get("plots", []):
        source = out_dir / "report" / plot
        if source.exists():
            target = DOCS / "experiments" / f"{name}-{plot}"
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(source, target)
            lines += [f"![{plot}](experiments/{target.name})", ""]
    lines += [readings().get(name, "(no reading yet)"), ""]
    return "\n".join(lines)


def header(command: str, machine_: str, commit_: str, date: str) -> str:
    """The table that heads every measured table: what made it, where, at which commit, when."""
    return ("| command | machine | commit | date |\n|---|---|---|---|\n"
            f"| {command} | {machine_} | {commit_} | {date} |\n")


def machine() -> str:
    import torch

    return f"{platform.platform()}, {os.cpu_count()} cores, torch {torch.__version__}"


def commit() -> str:
    """The checkout's short commit, `+dirty` with uncommitted changes ("unknown" outside git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout
    short = git("rev-parse", "--short", "HEAD").strip()
    if not short:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    return short + ("+dirty" if dirty else "")


def header_cells(lines: list[str]) -> list[str]:
    """The cells of a page's first header row (command, machine, commit, date), or []."""
    for at, line in enumerate(lines[:-2]):
        if line.replace(" ", "") == "|command|machine|commit|date|":
            row = lines[at + 2].replace("\\|", "\0")  # an escaped | inside a cell
            return [c.strip().replace("\0", "\\|") for c in row.strip().strip("|").split("|")]
    return []


def results_index(results: Path) -> str:
    """docs/results/README.md: every results page, with its title and the first header row."""
    rows = []
    for page in sorted(results.glob("*.md")):
        if page.name == "README.md":
            continue
        lines = page.read_text().splitlines()
        title = lines[0].removeprefix("# ").strip() if lines else page.stem
        cells = header_cells(lines)
        machine_, date = (cells[1], cells[3]) if len(cells) == 4 else ("", "")
        rows.append(f"| [{page.name}]({page.name}) | {title} | {machine_} | {date} |")
    return "\n".join([
        "# Measured results", "",
        "One page per measurement, named `<topic>_<machine>_<yyyymmdd>.md`. Every table is headed",
        "by the command, the machine, the commit and the date that produced it; the",
        "[guides](../README.md) link here instead of carrying dated figures. The FAST paper's",
        "questions are in [../experiments.md](../experiments.md). This index is written by",
        "`python3 experiments/make_docs.py --index`.", "",
        "| page | what | machine | date |", "|---|---|---|---|", *rows, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(ORDER), choices=ORDER)
    parser.add_argument("--index", action="store_true", help="only rewrite docs/results/README.md")
    args = parser.parse_args()
    results = DOCS / "results"
    if args.index:
        (results / "README.md").write_text(results_index(results))
        return
    intro = [
        "# Experiments: the FAST paper's questions", "",
        "Made by `python3 experiments/make_docs.py` (it runs `fastsgd bench` on each spec of "
        "experiments/ and writes this page; cells already run are kept in experiments/out/). "
        "Each section is headed by the command, machine, commit and date that made it. "
        "Simulated cells are "
        "deterministic: another machine gives the same tables, except (e), whose real cells "
        "are measured where it was made.", ""]
    page = DOCS / "experiments.md"
    kept = sections(page.read_text()) if page.exists() else {}
    body = [section(name, args.jobs) if name in args.only else kept.get(title(name), "")
            for name in ORDER]
    page.write_text("\n".join(intro + [part for part in body if part]))
    if results.is_dir():
        (results / "README.md").write_text(results_index(results))


def title(name: str) -> str:
    return read_toml(HERE / f"{name}.toml").get("doc", {}).get("title", name)


def sections(page: str) -> dict[str, str]:
    """A page's sections, by title: from each '## TITLE' to the next."""
    parts = page.split("\n## ")[1:]
    return {part.partition("\n")[0].strip(): "## " + part.rstrip("\n") + "\n"
            for part in parts}


if __name__ == "__main__":
    main()
