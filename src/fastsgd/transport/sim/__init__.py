"""The simulated cluster: N logical workers in one process, on a virtual clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastsgd.transport.sim.network import Network, parse_bandwidth, parse_seconds
from fastsgd.transport.sim.scheduler import Scheduler, SimAborted
from fastsgd.transport.sim.transport import SimFabric, SimTransport

__all__ = ["Network", "SimAborted", "SimTransport", "parse_bandwidth", "parse_seconds",
           "simulate"]


def simulate(world_size: int, fn: Callable[[SimTransport], Any], network: Network | None = None,
             slowdown: dict[int, float] | None = None) -> list[Any]:
    """Run `fn(transport)` for each of `world_size` logical workers; return their results.

    `slowdown[rank]` multiplies the compute time a worker measures (a straggler).
    """
    scheduler = Scheduler(world_size, slowdown)
    fabric = SimFabric(world_size, network or Network(), scheduler)
    transports = [SimTransport(r, fabric) for r in range(world_size)]
    return scheduler.run([lambda t=t: fn(t) for t in transports])
