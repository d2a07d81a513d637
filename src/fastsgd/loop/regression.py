"""The default iteration and evaluation of a regression (a dataset of floating-point
targets, kind "regression"): the mean squared error between the model's output and the
targets, averaged over samples and outputs, as `torch.nn.functional.mse_loss` does."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fastsgd.errors import UserError
from fastsgd.loop.plan import Batch, as_input, kept_modes
from fastsgd.workloads.data import test_batches
from fastsgd.workloads.dataset import Dataset


def mse_step(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Mean squared error of the batch."""
    x, y = batch
    return F.mse_loss(_outputs(model(as_input(model, x)), y, "step"), y.to(torch.float32))


@torch.no_grad()
def evaluate_mse(model: torch.nn.Module, dataset: Dataset,
                 device: torch.device) -> tuple[float, float]:
    """(NaN: a regression has no accuracy, mean squared error) on the held-out split."""
    total, count = 0.0, 0
    with kept_modes(model):
        model.eval()
        for x, y in test_batches(dataset.test_x, dataset.test_y):
            y = y.to(device)
            out = _outputs(model(as_input(model, x.to(device))), y, "evaluate")
            total += float(F.mse_loss(out, y.to(torch.float32), reduction="sum"))
            count += y.numel()
    return math.nan, total / count


def _outputs(out: object, y: torch.Tensor, which: str) -> torch.Tensor:
    """The model's output as float32 in y's shape: (N, 1) against targets (N,) is taken as
    the same; any other mismatch would broadcast into a wrong loss, so it is refused."""
    if isinstance(out, torch.Tensor) and out.shape != y.shape and y.dim() == 1 \
            and out.shape == (len(y), 1):
        out = out.reshape(len(y))
    if not isinstance(out, torch.Tensor) or out.shape != y.shape:
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) \
            else type(out).__name__
        raise UserError(f"the default {which} of a regression needs a model returning one "
                        f"value per target, shape {tuple(y.shape)} for this batch; this one "
                        f"returned {got}: pass {which}=")
    return out.float()
