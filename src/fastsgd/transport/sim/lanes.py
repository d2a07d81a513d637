"""Compute lanes: OS threads beside the scheduler's that run simulated workers' forward,
backward and optimizer step while the scheduler goes on with the others.

The scheduler runs one worker at a time, on one thread, so a simulated cluster used one core
however many the machine has. With a modeled compute time (`profile`, `fixed`) the virtual
clock does not depend on when, or on which thread, a worker's tensors are computed, only
that they are ready when the worker goes on. So a worker hands its compute to a lane, is
charged its modeled time and sleeps like any worker that computes; the scheduler runs the
others meanwhile, and when the worker's turn comes it waits for its lane's result (usually
long done). Torch releases the GIL inside its kernels, so the lane and the scheduler compute
at once.

The run stays bitwise what it is without lanes (`compute.lanes = 0`), whatever the machine's
load: a worker calls the scheduler in the same order either way (transport.py, `offload`),
every lane computes on one intra-op thread as the scheduler does, with the same kernels, and
what a worker's backward hooks ask of the transport (allreduce's buckets, launched during
backward) is replayed on the scheduler's thread in the order they asked, at the time they
would have asked. Three things would make the order of computing matter, so a run with
any of them gets no lanes (`job.py`): a step that draws from torch's global random
generator (dropout: the draws would interleave), workers that share their parameters
(hogwild: one's update would race another's forward), and measured compute (the wall time
is the charge).

A strategy's own passes over the model (a gossip mix) run on the scheduler's thread
between transport calls, and at hundreds of workers they were most of its time. What only
the worker's next compute needs goes to a lane too (`Transport.defer`): the worker goes on,
its next offloaded compute starts once the deferred work is done, and whatever reads the
model before that (evaluation, checkpoints, a donation, the end) calls `await_deferred()` first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

Replay = Callable[[torch.Tensor, bool], Any]  # an all-reduce asked on a lane: its handle


def cores() -> int:
    """Lanes for `compute.lanes = -1`: one per core this process may use. The scheduler's
    thread mostly waits for them (a synchronous strategy's workers all compute between two
    collectives), so it needs no core of its own."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _threads_like_the_scheduler() -> None:
    """Torch tells MKL its thread count per thread (mkl_set_num_threads_local): a new
    thread's MKL would use every core, and split its products differently from the
    scheduler's (other bits). Set on the lane what the simulator set for the run."""
    torch.set_num_threads(torch.get_num_threads())


AHEAD_BYTES = 256 * 2**20  # what lanes may compute ahead of the scheduler, in gradients


def ahead_for(model: torch.nn.Module, lanes: int) -> int:
    """How many offloaded computations may be out at once (Lanes.ahead): a worker's forward +
    backward on a lane is done as soon as a lane is free, not when the worker's turn comes,
    and its gradients live until its update. Without lanes, sgp's gradients lived only
    from a worker's backward to its update, one worker at a time; 1024 workers whose
    gradients were all computed ahead took 0.85 GiB more. About AHEAD_BYTES of gradients."""
    size = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return max(4 * lanes, AHEAD_BYTES // max(size, 1))


class Lanes:
    """`count` threads that compute what workers hand them, first come first served, with
    at most `ahead` results not yet taken (0: any number; more are computed in place)."""

    def __init__(self, count: int, ahead: int = 0):
        self.count, self.ahead = count, ahead
        self.out = 0  # handed to a lane and not yet taken back (the scheduler's thread's)
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="fastsgd-lane",
                                        initializer=_threads_like_the_scheduler)

    def submit(self, work: Callable[[], Any]) -> Future:
        grad = torch.is_grad_enabled()  # thread-local in torch: as the worker has it

        def run() -> Any:
            with torch.set_grad_enabled(grad):
                return work()

        return self._pool.submit(run)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class Deferred:
    """The handle of an all-reduce asked for on a compute lane (a backward hook): the
    collective itself starts when the worker's offload replays it."""

    def __init__(self) -> None:
        self.handle: Any = None

    def wait(self) -> None:
        assert self.handle is not None, "an all-reduce of a compute lane waited before replay"
        self.handle.wait()


def _after(prior: Future | None, work: Callable[[], Any]) -> Any:
    """`work()` once `prior` (submitted before it: already taken by a lane, so waiting on
    it cannot deadlock the pool) is done."""
    if prior is not None:
        prior.result()
    return work()


class LaneUser:
    """One simulated worker's use of the lanes (None: no lanes, all is done in place).
    `asked` records what its work on a lane asks of the transport (SimTransport.all_reduce);
    `pending` is its deferred work, which its next offloaded work waits for."""

    def __init__(self, lanes: Lanes | None):
        self.lanes = lanes
        self.asked: list[tuple[torch.Tensor, bool, Deferred]] | None = None
        self.pending: Future | None = None

    def offload(self, work: Callable[[Callable[[], None]], Any], charge: Callable[[], None],
                sleep: Callable[[], None], replay: Replay) -> Any:
        """`work(charged)` (Transport.offload); `sleep()` lets the others run till the
        worker's clock; `replay` asks for what `work` asked for on its lane, in order."""
        lanes = self.lanes
        if lanes is None or lanes.ahead and lanes.out >= lanes.ahead:  # computed in place
            self.await_deferred()
            return work(lambda: (charge(), sleep()))
        prior, self.pending = self.pending, None
        self.asked = []
        done = lanes.submit(lambda: _after(prior, lambda: work(lambda: None)))
        lanes.out += 1
        try:
            charge()
            sleep()
        finally:  # also when the worker crashes or the run stops: its lane is done with it
            try:
                result = done.result()
            finally:
                asked, self.asked = self.asked, None
                lanes.out -= 1
        for tensor, average, deferred in asked:
            deferred.handle = replay(tensor, average)
        return result

    def defer(self, work: Callable[[], None]) -> None:
        """Transport.defer: on a lane, after this worker's earlier deferred work."""
        if self.lanes is None:
            work()
            return
        prior = self.pending
        self.pending = self.lanes.submit(lambda: _after(prior, work))

    def await_deferred(self) -> None:
        """Wait for the deferred work (and raise what it raised)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()


def draws_random(step: Callable[[], torch.Tensor]) -> bool:
    """Whether one forward and backward (`step` returns the loss) draws from torch's global
    random generator, which every lane and the scheduler share; its state is put back."""
    state = torch.get_rng_state()
    try:
        step().backward()
        return not torch.equal(state, torch.get_rng_state())
    finally:
        torch.set_rng_state(state)
