"""fastsgd: FAST (Flexible (A)synchronous Scalable Training) for PyTorch.

The user writes one training iteration; fastsgd runs it on many workers, real or simulated,
and moves gradients or parameters between them by the chosen strategy.

The extension API: `StrategyBase` (with its `Capabilities`) and `Codec` are the classes a
strategy and a codec of your own subclass, `Option` declares their options and
`Configurable` checks them, `Context` is what a strategy is given, `Strategy` the protocol
a plain class may follow instead; their docstrings are the contract (docs/extending.md).

The names below are imported on first use (PEP 562): `import fastsgd` alone does not import
torch, so that the command line (cli.py) can take a Ctrl-C during torch's few seconds of
import like any other: one line, exit code 130, no traceback.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# Local workers are forked (launch.py). MKL's own memory manager is not fork-safe: a child
# can spin forever on an allocator lock the parent held at the fork (seen in
# mkl_serv_allocate under load). The system allocator is; MKL reads this at its first call.
os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")
# And torch.cuda.is_available() (the user's, before Job.run) asks NVML rather than the CUDA
# driver, which would leave forked workers unable to use CUDA.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

if TYPE_CHECKING:
    from fastsgd.compress import Codec, Identity
    from fastsgd.config.options import Configurable, Option
    from fastsgd.errors import ConfigError, UserError
    from fastsgd.job import Job
    from fastsgd.loop.replica import Replica
    from fastsgd.loop.results import Result
    from fastsgd.strategies import AllReduce, Capabilities, Context, Strategy, StrategyBase
    from fastsgd.transport.base import Transport
    from fastsgd.transport.sim import ComputeModel, Heterogeneity, Network, SimTransport
    from fastsgd.transport.torch_dist import TorchTransport
    from fastsgd.workloads import data, models

from fastsgd.config import VERSION

__version__ = VERSION

_WHERE = {"data": "fastsgd.workloads.data", "models": "fastsgd.workloads.models",
          "Codec": "fastsgd.compress", "Identity": "fastsgd.compress",
          "Configurable": "fastsgd.config.options", "Option": "fastsgd.config.options",
          "ConfigError": "fastsgd.errors", "UserError": "fastsgd.errors",
          "Job": "fastsgd.job", "Result": "fastsgd.loop.results", "Replica": "fastsgd.loop.replica",
          "AllReduce": "fastsgd.strategies", "Context": "fastsgd.strategies",
          "Strategy": "fastsgd.strategies", "StrategyBase": "fastsgd.strategies",
          "Capabilities": "fastsgd.strategies", "Transport": "fastsgd.transport.base",
          "ComputeModel": "fastsgd.transport.sim", "Heterogeneity": "fastsgd.transport.sim",
          "Network": "fastsgd.transport.sim", "SimTransport": "fastsgd.transport.sim",
          "TorchTransport": "fastsgd.transport.torch_dist"}

__all__ = ["AllReduce", "Capabilities", "Codec", "ComputeModel", "ConfigError", "Configurable",
           "Context", "Heterogeneity", "Identity", "Job", "Network", "Option", "Replica",
           "Result", "SimTransport", "Strategy", "StrategyBase", "TorchTransport", "Transport",
           "UserError", "connect", "data", "models"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'fastsgd' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if where.endswith(f".{name}") else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


def connect(backend: str = "auto", timeout: float = 300.0) -> TorchTransport:
    """Join the torch.distributed job this process belongs to (env:// rendezvous, as torchrun
    sets it up): the transport for a user who keeps their own loop (see `Replica`)."""
    from fastsgd.transport.torch_dist import TorchTransport

    return TorchTransport(backend, timeout)
