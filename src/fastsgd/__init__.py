"""fastsgd: FAST (Flexible (A)synchronous Scalable Training) for PyTorch.

The user writes one training iteration; fastsgd runs it on many workers, real or simulated,
and moves gradients or parameters between them by the chosen strategy.
"""

from __future__ import annotations

import os

# Local workers are forked (launch.py). MKL's own memory manager is not fork-safe: a child
# can spin forever on an allocator lock the parent held at the fork (seen in
# mkl_serv_allocate under load). The system allocator is; MKL reads this at its first call.
os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")

from fastsgd import data, models  # noqa: E402
from fastsgd.compress import Identity  # noqa: E402
from fastsgd.errors import ConfigError, UserError  # noqa: E402
from fastsgd.job import Job, Result  # noqa: E402
from fastsgd.replica import Replica  # noqa: E402
from fastsgd.strategies import AllReduce, Context, Strategy  # noqa: E402
from fastsgd.transport.base import Transport  # noqa: E402
from fastsgd.transport.sim import ComputeModel, Heterogeneity, Network, SimTransport  # noqa: E402
from fastsgd.transport.torch_dist import TorchTransport  # noqa: E402

__version__ = "0.1.0"

__all__ = ["AllReduce", "ComputeModel", "ConfigError", "Context", "Heterogeneity", "Identity",
           "Job", "Network", "Replica", "Result", "SimTransport", "Strategy", "TorchTransport",
           "Transport", "UserError", "connect", "data", "models"]


def connect(backend: str = "auto", timeout: float = 300.0) -> TorchTransport:
    """Join the torch.distributed job this process belongs to (env:// rendezvous, as torchrun
    sets it up): the transport for a user who keeps their own loop (see `Replica`)."""
    return TorchTransport(backend, timeout)
