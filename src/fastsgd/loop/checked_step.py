"""The user's step, called with what it returns checked: a mistake in it (no loss returned,
backward called inside, a loss that does not reach the model) is one line naming the worker,
not a traceback in fastsgd's loop or a run that trains nothing."""

from __future__ import annotations

import torch

from fastsgd.config.objects import described
from fastsgd.errors import UserError
from fastsgd.loop.plan import Batch, StepFn


class StepChecks:
    """model.step, called with its result checked (`where` starts each message: the worker).
    Every step: that it returned a loss backward can be called on, by type and flags only
    (every simulated worker pays it each step: no sync, no copy). Until a backward ran: that
    the step did not call backward itself, and then that the loss reached the model."""

    def __init__(self, step: StepFn, weights: list[torch.nn.Parameter], where: str):
        self.step, self.weights, self.where = step, weights, where
        self.first = True  # no backward yet: the checks that walk the parameters are on

    def __call__(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        fresh = self.first and all(p.grad is None for p in self.weights)
        loss = self.step(model, batch)
        if fresh and any(p.grad is not None for p in self.weights):
            raise UserError(f"{self.where}model.step called backward() itself; return the loss "
                            "and fastsgd calls backward")
        tensor = isinstance(loss, torch.Tensor)
        if tensor and loss.requires_grad and (loss.ndim == 0 or loss.numel() == 1):
            return loss
        if not tensor:
            what = "None" if loss is None else described(loss)
        elif loss.numel() != 1:
            what = f"a tensor of shape {tuple(loss.shape)} (reduce it, e.g. with .mean())"
        else:
            what = "a tensor that does not require grad (detached, or no trainable parameter in it)"
        raise UserError(f"{self.where}model.step returned {what}; it must return the batch's "
                        "loss as a scalar torch.Tensor that requires grad")

    def backward_done(self) -> None:
        """After fastsgd's backward: the first time, some parameter must have a gradient (a
        strategy or model may leave some without one, not all)."""
        if self.first:
            self.first = False
            if all(p.grad is None for p in self.weights):
                raise UserError(f"{self.where}model.step's loss does not depend on the model it "
                                "was given (no parameter got a gradient): compute it with the "
                                "model argument, not another model")
