"""The simulated cluster: N logical workers in one process, on a virtual clock."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from fastsgd.config.units import format_seconds
from fastsgd.transport.sim.compute import ComputeModel, Heterogeneity
from fastsgd.transport.sim.fabric import SimFabric
from fastsgd.transport.sim.faults import Faults, Membership
from fastsgd.transport.sim.lanes import Lanes
from fastsgd.transport.sim.network import Network, parse_bandwidth, parse_seconds
from fastsgd.transport.sim.rejoins import launcher
from fastsgd.transport.sim.scheduler import Scheduler, SimAborted
from fastsgd.transport.sim.trace import Trace, load_trace
from fastsgd.transport.sim.transport import SimTransport

__all__ = ["ComputeModel", "Faults", "Heterogeneity", "Network", "SimAborted", "SimTransport",
           "Trace", "load_trace", "parse_bandwidth", "parse_seconds", "simulate"]


def simulate(world_size: int, fn: Callable[[SimTransport], Any], network: Network | None = None,
             compute: ComputeModel | None = None, faults: Faults | None = None,
             on_death: Callable[[Callable[[int], int]], None] | None = None,
             steps: int | None = None, lanes: int = 0, ahead: int = 0) -> list[Any]:
    """Run `fn(transport)` for each of `world_size` logical workers; return their results
    (None for a worker that crashed).

    `compute` says how long computing takes (default: the wall time it took, measured);
    `faults`, which workers crash (faults.py); `on_death(handing_in)` is called at each crash
    and each return, with a function that says how many workers hand in their model at a
    step. `steps`: the run's, where a lost worker is replaced (run.rejoin: rejoins.py).
    `lanes`: threads that compute beside the scheduler (lanes.py; modeled compute only),
    with at most `ahead` computations out at once (0: any number).
    """
    compute = compute or ComputeModel()
    network = network or Network()
    network.check(world_size)
    if compute.trace is not None:
        compute.trace.check(world_size)
    factors = None if compute.deterministic else [compute.factor(r, 0, 0)
                                                  for r in range(world_size)]
    scheduler = Scheduler(world_size, factors)
    pool = Lanes(lanes, ahead) if lanes and compute.deterministic else None
    fabric = SimFabric(world_size, network, scheduler, compute, faults, pool)
    if on_death is not None:
        fabric.on_death.append(lambda: on_death(fabric.membership.handing_in))
    if faults is not None and faults.restart_ns is not None and steps:
        def start(rank: int, joining: tuple[int, int, int], when: int) -> None:
            transport = SimTransport(rank, fabric, joining)
            scheduler.spawn(rank, lambda: fn(transport), when)

        fabric.replace = launcher(fabric, steps, start)
    transports = [SimTransport(r, fabric) for r in range(world_size)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one worker computes at a time; a team per thread would thrash
    try:
        results = scheduler.run([lambda t=t: fn(t) for t in transports])
        _say_what_never_happened(fabric.membership, scheduler)
        return results
    finally:
        torch.set_num_threads(threads)
        if pool is not None:
            pool.close()


def _say_what_never_happened(membership: Membership, scheduler: Scheduler) -> None:
    """A crash timed past the run's end did not happen: said in one line each, with the
    clock it counts on (the simulation's, from its start, setup included)."""
    end = max(w.clock for w in scheduler.workers) / 1e9
    for rank, crash in membership.never_happened():
        print(f"fastsgd: faults.crash: worker {rank} at {format_seconds(crash.at_ns / 1e9)} "
              f"did not crash: the run ended first, at {format_seconds(end)} on the "
              "simulation's clock, which counts from its start, setup included (metrics' "
              "time counts from the start of training)", file=sys.stderr, flush=True)
