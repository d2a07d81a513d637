"""`fastsgd report`: report.csv, report.md, one PNG per plot and report.html, a page that
holds the table and every plot (embedded, so it can be mailed or archived alone)."""

from __future__ import annotations

import base64
import html
import os
from contextlib import suppress
from pathlib import Path
from typing import Any

from fastsgd.errors import UserError
from fastsgd.report import plots
from fastsgd.report.notes import notes
from fastsgd.report.runs import RunData
from fastsgd.report.table import (
    MLPERF,
    SEED_COLUMNS,
    markdown_columns,
    over_seeds,
    rows,
    seed_columns,
    to_csv,
    to_markdown,
)

WHY_NOT = {  # why a plot is missing
    "scaling.png": "needs a 1-worker run and a larger one of the same job",
    "consensus.png": "every model stayed identical (consensus distance 0) or was not measured",
    "staleness.png": "every step used fresh gradients and models (staleness 0)",
}
ONLY_IF_DRAWN = ("loss_time.png", "loss_bytes.png")  # language models, loss targets

STYLE = """body{font-family:sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #bbb;padding:3px 6px}
th{background:#eee}td{text-align:right}td:first-child,td:nth-child(2){text-align:left}
img{max-width:100%;display:block;margin:.5em 0 1.5em}.note{color:#666;font-size:13px}
.caveat{font-weight:bold;color:#a40}"""


def write_report(runs: list[RunData], out: str | Path, title: str = "fastsgd report",
                 plot_names: tuple[str, ...] | None = None) -> list[Path]:
    """Write the report of `runs` into `out`; returns the files written. `plot_names`
    limits the plots (a run's own small report draws fewer)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "a file is in the way" if out.exists() else e.strerror
        raise UserError(f"report folder {out}: cannot make it ({why})") from None
    for old in ["seeds.csv", *(name for name, _, _ in plots.PLOTS)]:  # an earlier report's
        (out / old).unlink(missing_ok=True)
    table, seeds = rows(runs), over_seeds(runs)
    markdown = f"# {title}\n\n{to_markdown(table)}"
    written = [_write(out / "report.csv", to_csv(table).encode())]
    if seeds:
        markdown += f"\n## Over seeds\n\n{MLPERF}\n\n{to_markdown(seeds, seed_columns(seeds))}"
        written.append(_write(out / "seeds.csv", to_csv(seeds, SEED_COLUMNS).encode()))
    written.append(_write(out / "report.md", markdown.encode()))
    images: list[tuple[str, str, bytes | None]] = []
    for name, caption, draw in plots.PLOTS:
        if plot_names is None or name in plot_names:
            png = draw(runs, table)
            if png is None and name in ONLY_IF_DRAWN:
                continue
            images.append((name, caption, png))
            if png is not None:
                written.append(_write(out / name, png))
    page = _html(title, runs, [(table, markdown_columns(table)), (seeds, seed_columns(seeds))],
                 images)
    written.append(_write(out / "report.html", page.encode()))
    return written


RUN_PLOTS = ("accuracy_time.png", "loss_time.png", "accuracy_bytes.png", "loss_bytes.png",
             "breakdown.png")


def write_run_report(run_dir: str | Path) -> Path:
    """A finished run's own small report, RUN_DIR/report/report.html (and its CSV,
    Markdown and plots); returns the page."""
    from fastsgd.report.runs import load_run

    run = load_run(run_dir)
    write_report([run], Path(run_dir) / "report", title=f"fastsgd run {run.name}",
                 plot_names=RUN_PLOTS)
    return Path(run_dir) / "report" / "report.html"


def _write(path: Path, data: bytes) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:  # a read-only folder, a full disk, a folder called report.md
        with suppress(OSError):
            tmp.unlink()
        raise UserError(f"{path}: cannot write the report ({e.strerror})") from None
    return path


def _table(table: list[dict[str, Any]], columns: tuple, name: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _ in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(show(r))}</td>" for _, show in columns)
                   + "</tr>" for r in table)
    return f"<table id='{name}'><tr>{head}</tr>{body}</table>"


def _html(title: str, runs: list[RunData], tables: list[tuple[list[dict[str, Any]], tuple]],
          images: list[tuple[str, str, bytes | None]]) -> str:
    (table, columns), (seeds, seed_columns) = tables
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    # times on different clocks, language models of different tokens or contexts
    parts += [f"<p class='caveat'>{html.escape(note)}</p>" for note in notes(table)]
    parts.append(_table(table, columns, "runs"))
    if seeds:
        parts += ["<h2>Over seeds</h2>", f"<p class='note'>{html.escape(MLPERF)}</p>",
                  _table(seeds, seed_columns, "seeds")]
    parts.append(_provenance(runs))
    for name, caption, png in images:
        parts.append(f"<h2>{html.escape(caption)}</h2>")
        if png is None:
            parts.append(f"<p class='note'>Not drawn: {WHY_NOT.get(name, 'nothing to show')}."
                         "</p>")
        else:
            data = base64.b64encode(png).decode()
            parts.append(f"<img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _provenance(runs: list[RunData]) -> str:
    """Which machine and command made each run (environment.json)."""
    items = []
    for r in runs:
        env = r.environment
        what = ", ".join(str(env[k]) for k in ("platform", "torch", "backend") if env.get(k))
        command = " ".join(env.get("command", []))
        items.append(f"<li>{html.escape(r.title)}: {html.escape(what or 'unknown')}"
                     + (f" &mdash; <code>{html.escape(command)}</code>" if command else "")
                     + "</li>")
    return f"<p class='note'>Runs, machines and commands:</p><ul class='note'>{''.join(items)}</ul>"
