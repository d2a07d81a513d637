"""fastsgd: FAST (Flexible (A)synchronous Scalable Training) for PyTorch.

The user writes one training iteration; fastsgd runs it on many workers, real or simulated,
and moves gradients or parameters between them by the chosen strategy.
"""

from __future__ import annotations

from fastsgd import data, models
from fastsgd.compress import Identity
from fastsgd.errors import ConfigError, UserError
from fastsgd.job import Job, Result
from fastsgd.replica import Replica
from fastsgd.strategies import AllReduce, Context, Strategy
from fastsgd.transport.base import Transport
from fastsgd.transport.sim import Network, SimTransport
from fastsgd.transport.torch_dist import TorchTransport

__version__ = "0.1.0"

__all__ = ["AllReduce", "ConfigError", "Context", "Identity", "Job", "Network", "Replica",
           "Result", "SimTransport", "Strategy", "TorchTransport", "Transport", "UserError",
           "connect", "data", "models"]


def connect(backend: str = "auto", timeout: float = 300.0) -> TorchTransport:
    """Join the torch.distributed job this process belongs to (env:// rendezvous, as torchrun
    sets it up): the transport for a user who keeps their own loop (see `Replica`)."""
    return TorchTransport(backend, timeout)
