"""The simulated cluster: N logical workers in one process, on a virtual clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastsgd.transport.sim.compute import ComputeModel, Heterogeneity
from fastsgd.transport.sim.network import Network, parse_bandwidth, parse_seconds
from fastsgd.transport.sim.scheduler import Scheduler, SimAborted
from fastsgd.transport.sim.trace import Trace, load_trace
from fastsgd.transport.sim.transport import SimFabric, SimTransport

__all__ = ["ComputeModel", "Heterogeneity", "Network", "SimAborted", "SimTransport", "Trace",
           "load_trace", "parse_bandwidth", "parse_seconds", "simulate"]


def simulate(world_size: int, fn: Callable[[SimTransport], Any], network: Network | None = None,
             compute: ComputeModel | None = None) -> list[Any]:
    """Run `fn(transport)` for each of `world_size` logical workers; return their results.

    `compute` says how long computing takes (default: the wall time it took, measured).
    """
    compute = compute or ComputeModel()
    network = network or Network()
    network.check(world_size)
    if compute.trace is not None:
        compute.trace.check(world_size)
    factors = None if compute.deterministic else [compute.factor(r, 0, 0)
                                                  for r in range(world_size)]
    scheduler = Scheduler(world_size, factors)
    fabric = SimFabric(world_size, network, scheduler, compute)
    transports = [SimTransport(r, fabric) for r in range(world_size)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one worker computes at a time; a team per thread would thrash
    try:
        return scheduler.run([lambda t=t: fn(t) for t in transports])
    finally:
        torch.set_num_threads(threads)
