"""The lines a report writes above its table where its runs cannot all be compared as they
stand, one line each: times on different clocks (clocks.py), and language models trained
on different numbers of tokens or validated on windows of different lengths
(model.context): a loss after 0.6M tokens is not one after 9.8M, and a loss over windows
of 64 tokens is not one over windows of 128 (each target has less or more before it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from fastsgd.report.clocks import clock_note
from fastsgd.report.text import human_count


def counted(counts: Counter, show: Callable[[Any], str]) -> str:
    """"5 runs 614k tokens, 10 runs 2.46M tokens": how many runs have each value, in the
    values' order."""
    return ", ".join(f"{n} {'run' if n == 1 else 'runs'} {show(value)}"
                     for value, n in sorted(counts.items()))


def differing(table: list[dict[str, Any]], key: str, what: str,
              show: Callable[[Any], str], advice: str) -> str:
    """One line saying that the rows' `key` differs ("Note: these language models WHAT:
    COUNTS; ADVICE"); "" where every row that has one has the same (or at most one has)."""
    counts = Counter(r[key] for r in table if r.get(key) is not None)
    if len(counts) < 2:
        return ""
    return f"Note: these language models {what}: {counted(counts, show)}; {advice}."


def tokens_note(table: list[dict[str, Any]]) -> str:
    """The language models of these rows trained on different numbers of tokens."""
    return differing(table, "tokens", "trained on different numbers of tokens",
                     lambda n: human_count(n) + " tokens",
                     "compare their losses only between runs of equal tokens (the tokens "
                     "column)")


def context_note(table: list[dict[str, Any]]) -> str:
    """The language models of these rows have different contexts, so that their validation
    losses are over windows of different lengths."""
    return differing(table, "context", "have different contexts (model.context)",
                     lambda n: f"{n} tokens", "their validation losses are over windows of "
                     "different lengths: compare losses only between runs of one context")


def notes(table: list[dict[str, Any]]) -> list[str]:
    """The notes for these rows (report.table's), each one line; none where every run can be
    compared with every other as it stands."""
    found = (clock_note(r["clock"] for r in table), tokens_note(table), context_note(table))
    return [note for note in found if note]
