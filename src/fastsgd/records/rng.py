"""Every random stream a training step may draw from, as a checkpoint holds them: a resumed
run draws what the run that never stopped would have."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Every random stream a step may draw from: torch's (CPU and CUDA), Python's, NumPy's."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            # this worker's GPU only: a resume may see fewer (CUDA_VISIBLE_DEVICES)
            "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_initialized() else [],
            "python": random.getstate(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]}


def set_rng_state(saved: dict[str, Any]) -> None:
    torch.set_rng_state(saved["torch"])
    if saved["cuda"]:
        torch.cuda.set_rng_state(saved["cuda"][0])
    random.setstate(saved["python"])
    name, keys, pos, has_gauss, gauss = saved["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
