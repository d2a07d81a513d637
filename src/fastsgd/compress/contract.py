"""The codec contract, checked when a job starts: a mistake in a codec class ends the job
in one line naming the class and the mistake, before any worker trains (`compression.name =
"module:Class"` through the registry, compress/__init__.py; an object given to
`fastsgd.Job`, loop/components.py; the conformance suite, testing/)."""

from __future__ import annotations

from fastsgd.compress.base import KINDS
from fastsgd.config.objects import described
from fastsgd.config.plugins import (
    constructor_problem,
    missing_method,
    name_problem,
    options_problem,
    refused,
    unlike,
)

METHODS = {"init": "(like)", "encode": "(tensor, state)", "compress": "(tensor)",
           "decode": "(payload, like)", "nbytes": "(payload)"}


def check_codec_class(cls: type) -> None:
    """ConfigError, in one line naming `cls` and its first mistake; None if it keeps the
    contract (fastsgd.Codec's docstrings)."""
    if not isinstance(cls, type):
        raise TypeError(f"check_codec_class takes a class, not {cls!r}")
    problem = (unlike(cls, METHODS, "codec") or name_problem(cls)
               or _kind_problem(cls) or _fields_problem(cls)
               or missing_method(cls, METHODS) or options_problem(cls)
               or constructor_problem(cls))
    if problem:
        raise refused("codec", cls, problem)


def _kind_problem(cls: type) -> str | None:
    """`kind`: how the codec's payloads meet in a collective, one of KINDS."""
    if not hasattr(cls, "kind"):
        return (f"has no kind: give it a class attribute kind = \"...\", one of "
                f"{', '.join(KINDS)} (fastsgd.Codec's docstring says which)")
    kind = cls.kind
    if kind not in KINDS:
        shown = repr(kind) if isinstance(kind, str) else described(kind)
        return f"has kind = {shown}: it must be one of {', '.join(KINDS)}"
    return None


def _fields_problem(cls: type) -> str | None:
    """`FIELDS`: the payload's tensors in wire order, a list of str."""
    found = getattr(cls, "FIELDS", None)
    if not isinstance(found, (list, tuple)) or not all(isinstance(f, str) for f in found):
        return (f"has FIELDS = {found!r}: it must list the payload's tensors by name, e.g. "
                "FIELDS = [\"values\"]")
    return None
