"""Codecs applied to the messages of every strategy, chosen by `[compression] name`."""

from __future__ import annotations

from typing import Any

from fastsgd.compress.base import Compressor, Identity, Payload
from fastsgd.errors import ConfigError
from fastsgd.options import validate_section

CODECS: dict[str, type] = {"none": Identity}

__all__ = ["CODECS", "Compressor", "Identity", "Payload", "build_compressor", "validate_options"]


def _codec_class(name: str) -> type:
    if name not in CODECS:
        raise ConfigError(f"unknown codec '{name}' (compression.name); "
                          f"choose one of: {', '.join(sorted(CODECS))}")
    return CODECS[name]


def validate_options(section: dict[str, Any]) -> dict[str, Any]:
    """Check the [compression] keys against the chosen codec's options."""
    name = section["name"]
    options = {k: v for k, v in section.items() if k != "name"}
    checked = validate_section("compression", options, _codec_class(name).OPTIONS)
    return {"name": name, **checked}


def build_compressor(section: dict[str, Any]) -> Compressor:
    section = validate_options(section)
    options = {k: v for k, v in section.items() if k != "name"}
    return _codec_class(section["name"])(**options)
