"""The report's tables in Markdown (report.md, the terminal) and the columns report.html
shows: the runs' table (table.rows), with the notes above it where its runs cannot all be
compared as they stand (notes.py), and the seeds' (table.over_seeds)."""

from __future__ import annotations

from typing import Any

from fastsgd.records.metrics import PHASES
from fastsgd.report.notes import notes
from fastsgd.report.text import epochs, human_bytes, human_count
from fastsgd.workloads.kinds import LOSS_KINDS, REGRESSION

MARKDOWN = (  # header, how to show a row's value
    ("run", lambda r: r["run"]),
    ("strategy / codec", lambda r: f"{r['strategy']} / {r['codec']}"),
    ("workers", lambda r: str(r["workers"])),
    ("accuracy", lambda r: _maybe(r["final_accuracy"], "{:.2%}")),
    ("clock", lambda r: r["clock"]),  # of the times right of it: simulated, measured
    ("time to target", lambda r: _seconds(r["time_to_target_s"]) if r["target_accuracy"] else ""),
    ("epochs to target", lambda r: _epochs(r["epochs_to_target"])),
    ("samples/s", lambda r: _maybe(r["samples_per_s"], "{:,.0f}")),
    ("bytes sent", lambda r: human_bytes(r["bytes_sent"])),
    ("comm. overhead", lambda r: _maybe(r["comm_overhead"], "{:.0%}")),
    ("mean step (ms): " + " / ".join(PHASES),
     lambda r: " / ".join(f"{r[p + '_ms']:.2f}" for p in PHASES)),
    ("consensus", lambda r: _maybe(r["consensus_distance"], "{:.3g}")),
    ("scaling eff.", lambda r: _maybe(r["scaling_efficiency"], "{:.0%}")),
)


SEEDS_MARKDOWN = (
    ("cell", lambda r: r["cell"]),
    ("seeds", lambda r: str(r["seeds"])),
    ("accuracy (mean ± sd)", lambda r: _maybe(r["accuracy_mean"], "{:.2%}")
     + _maybe(r["accuracy_sd"], " ± {:.2%}")),
    ("clock", lambda r: r["clock"]),
    ("time to target (MLPerf)", lambda r: _seconds(r["time_to_target_s"]) if r["target"] else ""),
    ("epochs to target (MLPerf)", lambda r: _epochs(r["epochs_to_target"])),
    ("samples/s (mean)", lambda r: _maybe(r["samples_per_s"], "{:,.0f}")),
)


def _time_column(table: list[dict[str, Any]], key: str, header: str, scored: str) -> tuple:
    """The time-to-target column: "time to loss 2.00" where every row has that target;
    else "time to target", each cell naming its own."""
    def seconds(r: dict[str, Any]) -> str:
        return _seconds(r[scored])
    named = {r[key] for r in table if r[key]}
    if len(named) <= 1:
        return (header.replace("target", named.pop() if named else "target"),
                lambda r: seconds(r) if r[key] else "")
    return header, lambda r: f"{r[key]}: {seconds(r)}" if r[key] else ""


def _loss_shown(table: list[dict[str, Any]]) -> bool:
    return any(r.get("target_metric") == "loss" or r.get("bits_per_byte") is not None
               or r.get("data_kind") in LOSS_KINDS for r in table)


TOKENS = ("tokens", lambda r: "" if r.get("tokens") is None else human_count(r["tokens"]))


def markdown_columns(table: list[dict[str, Any]]) -> tuple:
    """MARKDOWN for these rows: the time to their target named; the final loss, perplexity
    and bits per byte for runs that have a loss target or learn text; the tokens trained
    on, beside the workers, for language models."""
    columns = list(MARKDOWN)
    columns[5] = _time_column(table, "target", "time to target", "time_to_target_s")
    if _loss_shown(table):
        extra = [("loss", lambda r: _maybe(r["final_loss"], "{:.4f}"))]
        if any(r.get("final_perplexity") is not None for r in table):
            extra.append(("perplexity", lambda r: _maybe(r["final_perplexity"], "{:.4g}")))
        if any(r.get("bits_per_byte") is not None for r in table):
            extra.append(("bits/byte", lambda r: _maybe(r["bits_per_byte"], "{:.3f}")))
        columns[4:4] = extra
    if table and all(r.get("data_kind") == REGRESSION for r in table):  # no accuracy
        columns = [c for c in columns if c[0] != "accuracy"]
    if any(r.get("tokens") is not None for r in table):
        columns.insert(3, TOKENS)  # after the workers
    return tuple(columns)


def seed_columns(seeds: list[dict[str, Any]]) -> tuple:
    """SEEDS_MARKDOWN for these rows (as markdown_columns)."""
    columns = list(SEEDS_MARKDOWN)
    columns[4] = _time_column(seeds, "about", "time to target (MLPerf)", "time_to_target_s")
    if any(r.get("target_metric") == "loss" for r in seeds):
        columns.insert(3, ("loss (mean)", lambda r: _maybe(r["loss_mean"], "{:.4f}")))
    return tuple(columns)


def to_markdown(table: list[dict[str, Any]], columns: tuple | None = None) -> str:
    """The table; the runs' own (columns None) has above it a line for each of its notes
    (notes.notes: times on different clocks, language models of different tokens or
    contexts)."""
    said = notes(table) if columns is None else []
    columns = markdown_columns(table) if columns is None else columns
    lines = [line for note in said for line in (note, "")]
    lines += ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(show(r) for _, show in columns) + " |" for r in table]
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f} s"


def _epochs(value: float | None) -> str:
    return "" if value is None else epochs(value)


def _maybe(value: float | None, form: str) -> str:
    return "" if value is None else form.format(value)
