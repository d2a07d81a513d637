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
backward) is recorded, with or without lanes, and started on the scheduler's thread in the
order they asked, as the worker is charged its backward (SimTransport.compute). Three
things would make the order of computing matter, so a run with any of them gets no lanes
(launch/simulate.py): a step that draws from torch's global random generator (dropout: the draws
would interleave), workers that share their parameters (hogwild: one's update would race
another's forward), and measured compute (the wall time is the charge).

A strategy's own passes over the model (a gossip mix) run on the scheduler's thread
between transport calls, and at hundreds of workers they were most of its time. What only
the worker's next compute needs goes to a lane too (`Transport.defer`): the worker goes on,
its next offloaded compute starts once the deferred work is done, and whatever reads the
model before that (evaluation, checkpoints, a donation, the end) calls `await_deferred()` first.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

Asked = tuple[torch.Tensor, bool, "Deferred"]  # an all-reduce asked: tensor, average, handle


def cores() -> int:
    """Lanes for `compute.lanes = -1`: one per core this process may use. The scheduler's
    thread mostly waits for them (a synchronous strategy's workers all compute between two
    collectives), so it needs no core of its own."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


AHEAD_BYTES = 256 * 2**20  # what lanes may compute ahead of the scheduler, in gradients


def ahead_for(model: torch.nn.Module, lanes: int) -> int:
    """Lanes.ahead: about AHEAD_BYTES of gradients. A lane computes a worker's forward +
    backward as soon as it can, not when the worker's turn comes, and the gradients live
    until the worker's update: 1024 sgp workers whose gradients were all computed ahead
    took 0.85 GiB more than without lanes, where each lived from one worker's backward to
    its update."""
    size = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return max(4 * lanes, AHEAD_BYTES // max(size, 1))


class Task:
    """Work handed to the lanes. `result()` waits for it, or does it in place when no lane
    has started it (the lanes may be holding back: Lanes.ahead)."""

    def __init__(self, lanes: Lanes, work: Callable[[], Any], heavy: bool):
        self._lanes, self._work, self.heavy = lanes, work, heavy
        self._grad = torch.is_grad_enabled()  # thread-local in torch: as the worker has it
        self.started = False  # under the lanes' lock
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            with torch.set_grad_enabled(self._grad):
                self._value = self._work()
        except BaseException as e:  # noqa: BLE001 - raised where the result is taken
            self._error = e
        finally:
            self._done.set()

    def result(self) -> Any:
        if self._lanes.claim(self):
            self.run()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Lanes:
    """`count` threads beside the scheduler's that do what workers hand them. Work that
    frees memory (an update, deferred work) goes first; work that makes it (forward +
    backward: `heavy`) in the order given, with at most `ahead` of it started and its
    result not yet taken (0: any number)."""

    def __init__(self, count: int, ahead: int = 0):
        self.count, self.ahead = count, ahead
        self.held = 0  # heavy tasks started and not yet taken
        self._light: deque[Task] = deque()
        self._heavy: deque[Task] = deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, work: Callable[[], Any], heavy: bool = False) -> Task:
        task = Task(self, work, heavy)
        with self._cond:
            (self._heavy if heavy else self._light).append(task)
            if len(self._threads) < self.count:  # started once the simulator set its threads
                lane = threading.Thread(target=self._lane, args=(torch.get_num_threads(),),
                                        name=f"fastsgd-lane_{len(self._threads)}", daemon=True)
                lane.start()
                self._threads.append(lane)
            self._cond.notify()
        return task

    def _lane(self, threads: int) -> None:
        # torch tells MKL its thread count per thread (mkl_set_num_threads_local): a new
        # thread's MKL would use every core, and split its products differently from the
        # scheduler's (other bits). Set on the lane what the simulator set for the run.
        torch.set_num_threads(threads)
        while True:
            with self._cond:
                task = self._next()
                while task is None:
                    if self._closed:
                        return
                    self._cond.wait()
                    task = self._next()
                task.started = True
            task.run()

    def _next(self) -> Task | None:
        if self._light:
            return self._light.popleft()
        if self._heavy and (not self.ahead or self.held < self.ahead):
            self.held += 1
            return self._heavy.popleft()
        return None

    def claim(self, task: Task) -> bool:
        """Take `task` to do it in place, unless a lane has started it."""
        with self._cond:
            if task.started:
                return False
            (self._heavy if task.heavy else self._light).remove(task)
            task.started = True
            self.held += task.heavy
            return True

    def taken(self) -> None:
        """A heavy task's result was taken: another may start."""
        with self._cond:
            self.held -= 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for lane in self._threads:
            lane.join()


class Deferred:
    """The handle of an all-reduce asked during offloaded compute (a backward hook): the
    collective itself starts when the worker is charged its backward (SimTransport.compute)."""

    def __init__(self) -> None:
        self.handle: Any = None

    def wait(self) -> None:
        assert self.handle is not None, "waited for before the worker's backward started it"
        self.handle.wait()


def start_points(asked: list[Asked], backward: int) -> list[int]:
    """When each all-reduce `asked` during a backward of `backward` ns starts, in ns into it.
    Backward makes allreduce's buckets one after another, so with sizes S_0, S_1, ... bucket
    i is ready once (S_0 + ... + S_i) / (S_0 + S_1 + ...) of it is done (the last one as it
    ends): sizes are the measure of its progress that the simulator has."""
    sizes = [t.numel() * t.element_size() for t, _, _ in asked]
    total, made, points = sum(sizes), 0, []
    for size in sizes:
        made += size
        points.append(backward * made // total if total else backward)
    return points


def _after(prior: Task | None, work: Callable[[], Any]) -> Any:
    """`work()` once `prior` (this worker's deferred work, handed over before) is done."""
    if prior is not None:
        prior.result()
    return work()


class LaneUser:
    """One simulated worker's use of the lanes (None: no lanes, all is done in place).
    `asked` records what its offloaded work asks of the transport (SimTransport.all_reduce);
    `pending` is its deferred work, which its next offloaded work waits for. A worker's
    offloads alternate: forward + backward make its gradients (heavy), the update after
    them frees them."""

    def __init__(self, lanes: Lanes | None):
        self.lanes = lanes
        self.asked: list[Asked] | None = None
        self.pending: Task | None = None
        self.holding = False  # took a heavy result; its next offload frees it

    def offload(self, work: Callable[[Callable[[], None]], Any], charge: Callable[[], None],
                sleep: Callable[[], None], asked: list[Asked] | None = None) -> Any:
        """`work(charged)` (Transport.offload); `sleep()` lets the others run till the
        worker's clock. The asynchronous all-reduces `work` asks for are appended to
        `asked`, for the worker to start later; None: they start when asked (measured
        compute, which gets no lanes: work on a lane must not call the scheduler)."""
        assert asked is not None or self.lanes is None, "a lane's work must record"
        self.asked = asked
        try:
            if self.lanes is None:
                return work(lambda: (charge(), sleep()))
            return self._on_lane(self.lanes, work, charge, sleep)
        finally:
            self.asked = None

    def _on_lane(self, lanes: Lanes, work: Callable[[Callable[[], None]], Any],
                 charge: Callable[[], None], sleep: Callable[[], None]) -> Any:
        heavy = not self.holding
        prior, self.pending = self.pending, None
        task = lanes.submit(lambda: _after(prior, lambda: work(lambda: None)), heavy)
        try:
            charge()
            sleep()
        finally:  # also when the worker crashes or the run stops: its lane is done with it
            try:
                result = task.result()
            finally:
                if heavy:
                    lanes.taken()
        self.holding = heavy
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
