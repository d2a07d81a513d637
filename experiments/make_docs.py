"""Regenerate docs/experiments.md: run every spec of experiments/ with `fastsgd bench`
(resumable: cells already in experiments/out/ are not rerun), then write each one's
tables and plots, with the hand-written reading from experiments/readings.md.

    python3 experiments/make_docs.py [--jobs 2] [--only scaling nodes]

With --only, the other sections are kept as the page has them (each says when it was made).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
from pathlib import Path

from fastsgd.bench import run_bench
from fastsgd.bench.runner import cell_dir, done, plan
from fastsgd.config import read_toml
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
             f"Spec: [experiments/{name}.toml](../experiments/{name}.toml), "
             f"{len(runs)} of {len(matrix)} cells, made {datetime.date.today().isoformat()} on "
             f"{platform.platform()} ({os.cpu_count()} cores). "
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(ORDER), choices=ORDER)
    args = parser.parse_args()
    header = [
        "# Experiments: the FAST paper's questions", "",
        "Made by `python3 experiments/make_docs.py` (it runs `fastsgd bench` on each spec of "
        "experiments/ and writes this page; cells already run are kept in experiments/out/). "
        "Each section says when and on which machine it was made. Simulated cells are "
        "deterministic: another machine gives the same tables, except (e), whose real cells "
        "are measured where it was made.", ""]
    page = DOCS / "experiments.md"
    kept = sections(page.read_text()) if page.exists() else {}
    body = [section(name, args.jobs) if name in args.only else kept.get(title(name), "")
            for name in ORDER]
    page.write_text("\n".join(header + [part for part in body if part]))


def title(name: str) -> str:
    return read_toml(HERE / f"{name}.toml").get("doc", {}).get("title", name)


def sections(page: str) -> dict[str, str]:
    """A page's sections, by title: from each '## TITLE' to the next."""
    parts = page.split("\n## ")[1:]
    return {part.partition("\n")[0].strip(): "## " + part.rstrip("\n") + "\n"
            for part in parts}


if __name__ == "__main__":
    main()
