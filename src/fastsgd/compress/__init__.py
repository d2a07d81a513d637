"""Codecs applied to the messages of every strategy, chosen by `[compression] name`."""

from __future__ import annotations

from fastsgd.compress.base import KINDS, Codec, Compressor, Identity, Payload
from fastsgd.compress.contract import check_codec_class
from fastsgd.compress.powersgd import PowerSGD
from fastsgd.compress.qsgd import QSGD
from fastsgd.compress.quantize import BF16, FP16, OneBit, Sign
from fastsgd.compress.sparse import DGC, RandomK, TopK
from fastsgd.config.options import Registry

CODECS = Registry("compression", "codec", {
    cls.name: cls for cls in (Identity, FP16, BF16, OneBit, Sign, QSGD, TopK, RandomK, DGC,
                              PowerSGD)}, contract=check_codec_class)
validate_options = CODECS.validate
build_compressor = CODECS.build

__all__ = ["CODECS", "KINDS", "Codec", "Compressor", "Identity", "Payload", "build_compressor",
           "check_codec_class", "validate_options"]
