"""run.precision: the forward (the user's step) under autocast, the parameters and so the
gradients in fp32, which is what the codecs and strategies see.

- bf16: torch.autocast(bfloat16) on the CPU or a GPU; bf16 has fp32's exponent range, so
  no loss scaling.
- fp16 (CUDA only): autocast(float16) and a `torch.amp.GradScaler`: the loss is scaled
  before backward and the gradients unscaled right after it, before the strategy takes
  them; a scaled gradient that overflowed is not finite, which the loop treats as any
  non-finite gradient (the worker skips its step), and the scale backs off.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from fastsgd.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(name: str, on_cpu: bool, where: str = "this run's workers run on cpu"
                    ) -> None:
    """fp16 without a GPU: refused in one line (fp16 gradients need CUDA's loss scaling)."""
    if name == "fp16" and on_cpu:
        raise ConfigError(f"run.precision = 'fp16' needs a CUDA GPU (loss scaling of fp16 "
                          f"gradients); {where}: use run.precision = 'bf16'")


class Precision:
    """A worker's run.precision on its `device`."""

    def __init__(self, name: str, device: torch.device):
        check_precision(name, device.type != "cuda", f"this worker runs on {device.type}")
        self.name, self.device_type = name, device.type
        self.scaler = torch.amp.GradScaler("cuda") if name == "fp16" else None

    @property
    def holds_gradients(self) -> bool:
        """Whether gradients must stay on the worker until unscaled (no overlap)."""
        return self.scaler is not None

    def autocast(self) -> AbstractContextManager[object]:
        if self.name not in DTYPES:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=DTYPES[self.name])

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """After the last backward: true gradients in p.grad, the scale updated for the
        next step (halved if this one overflowed, which the finite check then skips)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
            self.scaler.update()

    def state_dict(self) -> dict[str, float | int]:
        """fp16's loss scale and its growth count (a checkpoint's: a resumed run scales as
        the run without a stop did); empty otherwise."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
