"""Codecs applied to the messages of every strategy, chosen by `[compression] name`."""

from __future__ import annotations

from fastsgd.compress.base import Compressor, Identity, Payload
from fastsgd.options import Registry

CODECS = Registry("compression", "codec", {"none": Identity})
validate_options = CODECS.validate
build_compressor = CODECS.build

__all__ = ["CODECS", "Compressor", "Identity", "Payload", "build_compressor", "validate_options"]
