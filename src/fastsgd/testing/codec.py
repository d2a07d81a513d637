"""A codec's own contract, on tensors alone (before any job): its payload holds the fields
it declares, decodes to the shape and dtype it was given, and an exact codec is exact. A
`lowrank` codec (PowerSGD) all-reduces its own factors, so only a job checks it."""

from __future__ import annotations

from typing import Any

import torch


def codec_contract(codec: Any, label: str) -> None:
    """AssertionError in one line naming the codec and the broken promise."""
    named = f"codec '{label}'"
    like = torch.randn(64, 17, generator=torch.Generator().manual_seed(0))
    state = codec.init(like)
    if not isinstance(state, dict):
        raise AssertionError(f"{named} fails 'contract': init returned {type(state).__name__}, "
                             "not a dict of tensors")
    if codec.kind == "lowrank":  # it all-reduces its own factors: checked in a job only
        return
    for name, payload in (("encode", codec.encode(like, state)), ("compress",
                                                                 codec.compress(like))):
        fields = list(getattr(codec, "FIELDS", []) or [])
        if fields and sorted(payload) != sorted(fields):
            raise AssertionError(f"{named} fails 'contract': {name} gave fields "
                                 f"{sorted(payload)}, FIELDS declares {sorted(fields)}")
        if not all(isinstance(t, torch.Tensor) for t in payload.values()):
            raise AssertionError(f"{named} fails 'contract': {name}'s payload holds something "
                                 "other than tensors")
        decoded = codec.decode(payload, like)
        if decoded.shape != like.shape or decoded.dtype != like.dtype:
            raise AssertionError(f"{named} fails 'contract': decode gave {decoded.dtype} "
                                 f"{tuple(decoded.shape)} for {like.dtype} {tuple(like.shape)}")
        if not bool(torch.isfinite(decoded).all()):
            raise AssertionError(f"{named} fails 'contract': decode gave a NaN or inf")
        size = codec.nbytes(payload)
        if not isinstance(size, int) or size < 0:
            raise AssertionError(f"{named} fails 'contract': nbytes gave {size!r}, not a "
                                 "count of bytes")
        if codec.kind == "exact" and not torch.equal(decoded, like):
            raise AssertionError(f"{named} fails 'contract': kind 'exact', but decode(encode(x))"
                                 " is not x")
