"""Worker backends: the framework that computes a worker's step (docs/frameworks.md).

fastsgd's strategies and codecs move torch tensors. A backend for another framework (JAX,
or a packed torch.export graph) is a `torch.nn.Module` facade over the user's model:

- its parameters (and buffers) are torch tensors, the canonical state that strategies read
  and write in place; the framework sees them without copies (DLPack) at each step;
- `loss(x, y)` returns the batch's loss as a torch scalar whose `backward()` fills each
  parameter's `.grad` with the framework's gradient;
- calling it, `model(x)`, returns the outputs as a torch tensor, for evaluation.

`model_loss_step` is the step of such a model. The optimizer stays a torch one (it updates
the torch parameters), or is the framework's own behind a torch.optim.Optimizer (optax).
"""

from fastsgd.frameworks.base import Backend, brings_its_step, model_loss_step

__all__ = ["Backend", "brings_its_step", "model_loss_step"]
