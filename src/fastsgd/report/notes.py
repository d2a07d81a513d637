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


def tokens_note(table: list[dict[str, Any]]) -> str:
    """One line saying that the language models of these rows trained on different numbers
    of tokens; "" where they all trained on as many (or there is at most one)."""
    counts = Counter(r["tokens"] for r in table if r.get("tokens") is not None)
    if len(counts) < 2:
        return ""
    return ("Note: these language models trained on different numbers of tokens: "
            f"{counted(counts, lambda n: human_count(n) + ' tokens')}; compare their losses "
            "only between runs of equal tokens (the tokens column).")


def context_note(table: list[dict[str, Any]]) -> str:
    """One line saying that the language models of these rows have different contexts, so
    that their validation losses are over windows of different lengths; "" where not."""
    counts = Counter(r["context"] for r in table if r.get("context") is not None)
    if len(counts) < 2:
        return ""
    return ("Note: these language models have different contexts (model.context): "
            f"{counted(counts, lambda n: f'{n} tokens')}; their validation losses are over "
            "windows of different lengths: compare losses only between runs of one context.")


def notes(table: list[dict[str, Any]]) -> list[str]:
    """The notes for these rows (report.table's), each one line; none where every run can be
    compared with every other as it stands."""
    found = (clock_note(r["clock"] for r in table), tokens_note(table), context_note(table))
    return [note for note in found if note]
