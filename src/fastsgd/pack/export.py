"""The user's model and step as two graphs of ATen operations (torch.export), with no source.

`loss(params, buffers, x, y) -> (loss, *buffers)` is the step in training mode; autograd
differentiates it at run time exactly as it would the eager code (the same operators, so
the same kernels: bitwise the same gradients on CPU). `forward(params, buffers, x) ->
output` is the model in eval mode, for evaluation. Parameters and buffers are inputs, not
constants of the graphs, so the archive holds them once and the graphs hold no data.

What a graph reveals is what it computes: operator names, shapes, the graph's own input
names (params_0, x, y). Every node's metadata (stack traces with file names and source
lines, module paths and class names) is dropped before saving.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterator

import torch
from torch import nn

from fastsgd.errors import UserError
from fastsgd.frameworks.base import user_code_failed

StepFn = Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]
KEPT_META = ("val", "tensor_meta")  # what the serializer needs: shapes and dtypes


class _Step(nn.Module):
    """step(model, batch) as a module, so that functional_call can run it with the graph's
    inputs in place of the model's parameters and buffers, while the step sees the model
    itself (submodules, attributes and all)."""

    def __init__(self, model: nn.Module, step: StepFn) -> None:
        super().__init__()
        self.model, self.__dict__["step"] = model, step

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.step(self.model, (x, y))


class _Loss(nn.Module):
    def __init__(self, model: nn.Module, step: StepFn) -> None:
        super().__init__()
        self.__dict__["inner"] = _Step(model, step)  # not a submodule: its state is inputs

    def forward(self, params: list[torch.Tensor], buffers: list[torch.Tensor],
                x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = _state(self.inner, params, buffers)
        loss = torch.func.functional_call(self.inner, state, (x, y))
        # buffers the step updated in place (BatchNorm's running statistics) are outputs
        return (loss, *(state[name] for name, _ in self.inner.named_buffers()))


class _Forward(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.__dict__["model"] = model

    def forward(self, params: list[torch.Tensor], buffers: list[torch.Tensor],
                x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.model, _state(self.model, params, buffers), (x,))


def _state(model: nn.Module, params: list[torch.Tensor],
           buffers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    return dict(zip(names, [*params, *buffers]))


def export_programs(model: nn.Module, step: StepFn, x: torch.Tensor, y: torch.Tensor,
                    inputs: torch.Tensor | None = None) -> tuple[bytes, bytes]:
    """(loss, forward) as saved ExportedPrograms, for any batch size; UserError naming the
    operation and the line where the step or the model cannot be captured. The step takes
    the batch (x, y); the model `inputs` (x itself unless given: a language model's
    windows less their last token)."""
    inputs = x if inputs is None else inputs
    params = [p.detach() for p in model.parameters()]
    buffers = [b.detach() for b in model.buffers()]
    batch = torch.export.Dim("batch", min=1)
    fixed = [None] * len(params), [None] * len(buffers)
    was_training = model.training
    try:
        model.train()
        loss = _export(_Loss(model, step), (params, buffers, x, y),
                       (*fixed, {0: batch}, {0: batch}), "model.step")
        _check_scalar(loss)
        model.eval()
        forward = _export(_Forward(model), (params, buffers, inputs), (*fixed, {0: batch}),
                          "model.name")
    finally:
        model.train(was_training)
    return _save(loss), _save(forward)


def _export(module: nn.Module, args: tuple, dynamic: tuple,
            key: str) -> torch.export.ExportedProgram:
    try:
        with quiet():
            program = torch.export.export(module, args, dynamic_shapes=dynamic, strict=False)
    except Exception as e:  # noqa: BLE001 - whatever export raises is the user's code's
        raise UserError(f"{key} cannot be exported to a graph (fastsgd pack): "
                        f"{user_code_failed(e)}") from None
    captured = [s.target or s.arg.name for s in program.graph_signature.input_specs
                if s.kind != torch.export.graph_signature.InputKind.USER_INPUT]
    if captured:  # they would be frozen into the graph, and never trained or updated
        raise UserError(f"{key} uses tensors that are neither the model's parameters or "
                        f"buffers nor the batch ({', '.join(map(str, captured))}): make them "
                        "parameters or buffers of the model")
    return program


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Export's own warnings and its dump of a partial graph would bury the one line that
    says what failed, and where (logging is process-wide: pack is a command of its own).
    Errors too: export logs the failing operation at ERROR level, through handlers that
    hold the stderr of before the redirection, and then raises what the one line says."""
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def _check_scalar(program: torch.export.ExportedProgram) -> None:
    loss = program.graph_signature.output_specs[0].arg
    node = next(n for n in program.graph.nodes if n.name == getattr(loss, "name", None))
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() != 0 or not value.is_floating_point():
        what = (f"a {str(value.dtype).removeprefix('torch.')} tensor of shape "
                f"({', '.join(str(d) if isinstance(d, int) else 'batch' for d in value.shape)})"
                if isinstance(value, torch.Tensor) else type(value).__name__)
        raise UserError(f"model.step must return the batch's loss as a floating-point scalar "
                        f"tensor; it returned {what}")


def _save(program: torch.export.ExportedProgram) -> bytes:
    """The program without source: node metadata dropped, no example inputs (a pickle)."""
    for node in program.graph.nodes:
        node.meta = {k: v for k, v in node.meta.items() if k in KEPT_META}
    program._example_inputs = None
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()
