"""What every worker backend shares: its step, and its tensors under their own names."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from fastsgd.errors import UserError


@runtime_checkable
class Backend(Protocol):
    """A model computed by another framework, seen as a torch module (see __init__)."""

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


NO_DDP = ("strategy.name = 'ddp' wraps the model in torch's DDP, whose forward a packed or "
          "JAX model does not run: use allreduce, the same algorithm")


def model_loss_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The step of a model that brings its own loss (a backend): `model.loss(x, y)`."""
    loss = getattr(model, "loss", None)
    if not callable(loss):
        raise UserError(f"model.step = model_loss needs a model with its own loss(x, y) (a "
                        f"JAX model, or a packed job); {type(model).__name__} has none")
    return loss(*batch)


def brings_its_step(model: Any) -> bool:
    """Whether `model` (a backend's factory) computes the loss itself: then model_loss_step
    is its step unless the user gives one."""
    return bool(getattr(model, "BRINGS_ITS_STEP", False))


def register(root: nn.Module, name: str, tensor: torch.Tensor, parameter: bool) -> None:
    """`tensor` as `root`'s parameter or buffer `name` (a.b.weight: in submodule a.b, made
    empty where missing), so that state_dict() keys read as the user's own names."""
    *path, attr = name.split(".")
    module = root
    for part in path:
        if part not in module._modules:
            module.add_module(part, nn.Module())
        module = module._modules[part]
    if parameter:
        module.register_parameter(attr, nn.Parameter(tensor))
    else:
        module.register_buffer(attr, tensor)


HINTS = {  # errors whose first line does not say what the user did
    "GuardOnDataDependentSymNode": "a Python branch or conversion on a tensor's value "
    "(data-dependent control flow; torch.where or torch.cond can express it in the graph)",
    "ConcretizationTypeError": "a Python branch or conversion on a traced array's value "
    "(jnp.where or jax.lax.cond can express it)"}


def user_code_failed(e: Exception) -> str:
    """What went wrong in the user's code, in one line: why, and the innermost line of the
    user's own code it came from (not torch's, JAX's or ours)."""
    name = type(e).__name__
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    why = f"{HINTS[name]} [{name}]" if name in HINTS else \
        f"{name}: {lines[0] if lines else 'no message'}"
    return why + _where(e)


def _where(e: Exception) -> str:
    """ (at FILE:LINE in FUNCTION: CODE), the innermost frame of the user's own code."""
    ours = str(Path(__file__).parent.parent)
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(ours) and "/site-packages/" not in f.filename
              and "/dist-packages/" not in f.filename and not f.filename.startswith("<")]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()})"
