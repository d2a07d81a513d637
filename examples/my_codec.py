"""A codec of your own: two bits an element (a ternary quantizer with error feedback).

Each message sends a scale (the mean magnitude) and, per element, one of -1, 0, +1 packed
four to a byte: an element is sent as +-scale where its magnitude passes half the scale,
else as 0. Error feedback (Seide et al. 2014; Karimireddy et al. 2019) carries what a
message leaves out into the next one.

    fastsgd simulate --set compression.name=my_codec:TwoBit
"""

from __future__ import annotations

import torch

from fastsgd import Codec, Option
from fastsgd.compress import Payload

SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)


class TwoBit(Codec):
    name = "twobit"
    kind = "quantize"  # fixed-size payloads: a compressed reduce-scatter and all-gather
    FIELDS = ["scale", "codes"]
    OPTIONS = {"error_feedback": Option(bool, True, doc="carry what a message leaves out")}

    def __init__(self, error_feedback: bool = True):
        self.error_feedback = error_feedback

    def compress(self, tensor: torch.Tensor) -> Payload:
        flat = tensor.reshape(-1)
        scale = flat.abs().mean().reshape(1)
        codes = torch.ones_like(flat, dtype=torch.uint8)  # 1 stands for 0
        codes[flat > scale / 2] = 2
        codes[flat < -scale / 2] = 0
        padded = torch.nn.functional.pad(codes, (0, -flat.numel() % 4), value=1)
        packed = (padded.view(-1, 4) << SHIFTS).sum(dim=1, dtype=torch.uint8)
        return {"scale": scale, "codes": packed}

    def decode(self, payload: Payload, like: torch.Tensor) -> torch.Tensor:
        codes = (payload["codes"].unsqueeze(1) >> SHIFTS) & 3
        signs = codes.reshape(-1)[:like.numel()].to(like.dtype) - 1
        return (signs * payload["scale"].to(like.dtype)).view_as(like)
