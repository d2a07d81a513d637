"""The Transport protocol: the only way strategies move bytes between workers.

Two implementations share it: `TorchTransport` (real processes, torch.distributed) and
`SimTransport` (logical workers in one process on a virtual clock). Byte counters follow
the same rules in both, so their figures can be compared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from fastsgd.errors import UserError


class PeerLost(RuntimeError):
    """A peer this worker waited for has left the run (it crashed): `peers` are the ranks.
    Raised by `recv`, `exchange` (after every other transfer of the exchange is done) and
    `wait_message` (when a departure became known while it waited, so that the caller can
    count again what it still expects). From `exchange`, `received` holds what did arrive."""

    def __init__(self, peers: list[int], received: dict[int, torch.Tensor] | None = None):
        super().__init__(f"worker{'s' if len(peers) > 1 else ''} "
                         f"{', '.join(map(str, peers))} left the run")
        self.peers, self.received = peers, received or {}


class PeerStalled(UserError):
    """A collective or a message waited run.timeout for peers that did not come, though none
    died: one is stalled (stopped, swapping, or far slower than the rest). Said in one line."""

    def __init__(self, rank: int, timeout: float, peer: int | None = None):
        whom = f"for worker {peer}, alive but silent" if peer is not None else (
            "in a collective for peers that are alive but did not come")
        super().__init__(f"worker {rank} waited run.timeout = {timeout:g} s {whom}: it is "
                         "stalled (stopped, swapping, or far slower than the others); raise "
                         "run.timeout if it is only slow")


class GroupBroken(RuntimeError):
    """A collective failed because workers died (`lost`); raised only by a transport told to
    shrink (TorchTransport.shrinkable). The survivors call `transport.shrink()` and go on."""

    def __init__(self, lost: list[int]):
        super().__init__(f"worker{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} "
                         "died during a collective")
        self.lost = lost


class Handle(Protocol):
    """An operation in flight; `wait()` returns once its result is in place."""

    def wait(self) -> None: ...


class Done:
    """The handle of an operation that has already completed."""

    def wait(self) -> None:
        return None


@runtime_checkable
class Transport(Protocol):
    rank: int
    world_size: int
    device: torch.device
    bytes_sent: int
    bytes_received: int

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False,
                   average: bool = False) -> Handle:
        """Sum `tensor` over all workers, in place; `average`: then divide it by the number of
        workers taking part (the survivors, once one is lost). With `async_op`, its contents
        are undefined until the handle's `wait()` (the simulator may take its memory
        meanwhile where no view shares it, and give it a new one with the result)."""
        ...

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every worker's `tensor` (same shape on all), in rank order."""
        ...

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Overwrite `tensor` with rank `src`'s, in place."""
        ...

    def send(self, tensor: torch.Tensor, dst: int) -> Handle:
        """Start sending `tensor` to `dst`; the receiver must post a matching `recv`."""
        ...

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Block until a tensor from `src` has arrived, written into `tensor`."""
        ...

    def exchange(self, outgoing: list[tuple[int, torch.Tensor]], sources: list[int],
                 like: torch.Tensor) -> dict[int, torch.Tensor]:
        """Send each (dst, tensor) of `outgoing` and receive a tensor shaped like `like` from
        each of `sources`, both directions of every link at once; what came, by source.
        Neither the outgoing tensors nor those that came may be changed afterwards: the
        simulator hands the sender's tensor to every receiver as it is."""
        ...

    def barrier(self) -> None: ...

    def shared_tensor(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """Collective: one tensor in shared memory for all workers (one machine only)."""
        ...

    def start_messages(self) -> None:
        """Collective: prepare for asynchronous messages (post/poll/wait_message)."""
        ...

    def post(self, tensor: torch.Tensor, dst: int, tag: int, droppable: bool = False) -> Handle:
        """Send an asynchronous message: it never waits for the receiver. A `droppable` one
        may be lost on a lossy (simulated) network; the others are sent again until they
        arrive, as TCP does. Neither the sender nor the receiver changes `tensor` afterwards:
        the simulator delivers it as it is. The handle's `wait()` returns once the message
        has left this worker (written to its connection; past the simulated uplink), so a
        sender can bound what it has queued (sgp's max_in_flight)."""
        ...

    def poll(self, tag: int) -> list[tuple[int, torch.Tensor]]:
        """Every message with `tag` that has arrived, as (source rank, flat tensor)."""
        ...

    def wait_message(self, tag: int) -> tuple[int, torch.Tensor]:
        """Block until a message with `tag` arrives; return (source rank, flat tensor)."""
        ...

    def members(self) -> list[int]:
        """The ranks this worker counts as alive, in order; collectives run among them."""
        ...

    def departed(self) -> dict[int, tuple[int, float]]:
        """The workers known to have left: rank -> (the step it left at, the time in seconds
        it was lost). A worker that left at step k took part in steps 0..k-1 only."""
        ...

    def absent(self, step: int) -> set[int]:
        """The workers that take no part in `step`: those that left at or before it, less
        those a worker that joined in their place stands for again (run.rejoin)."""
        ...

    def returned_at(self, rank: int, step: int) -> int:
        """The step from which the process now standing for `rank` at `step` takes part: 0,
        or the step a new worker joined at in a lost one's place (run.rejoin)."""
        ...

    def now(self) -> float:
        """Seconds since the transport started: wall clock, or the virtual clock."""
        ...

    def off_clock(self) -> None:
        """Exclude the time since the last call from the simulated clock (no-op when real)."""
        ...

    def compute(self, phase: str, step: int, share: float = 1.0) -> None:
        """`phase` (forward, backward, update, codec) of `step` is done: the simulator charges
        its compute model's time for it, times `share` (the codec's: the part of a whole
        gradient it encoded); a no-op when real."""
        ...

    def offload(self, work: Callable[[Callable[[], None]], Any],
                charge: Callable[[], None]) -> Any:
        """`work(charged)`, which calls `charged()` once, after the part of it that `charge`
        accounts for; its result. Real: `work(charge)`. The simulator may run `work` on a
        compute lane while other workers run (sim/lanes.py)."""
        ...

    def defer(self, work: Callable[[], None]) -> None:
        """`work()`, which writes only what this worker's own next compute reads (a gossip
        mix into its parameters). Real: now. The simulator may run it on a compute lane,
        to be done before this worker's next `offload`; whoever reads what it writes before
        that calls `await_deferred()` first."""
        ...

    def await_deferred(self) -> None:
        """Deferred work is done (no-op when real)."""
        ...


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def ring_allreduce_bytes(size: int, world_size: int) -> int:
    """Bytes one worker sends in a ring all-reduce of `size` bytes: 2(n-1)/n * size.

    (Reduce-scatter then all-gather, each n-1 chunks of size/n; nccl-tests PERFORMANCE.md.)
    """
    n = world_size
    return 0 if n == 1 else (2 * (n - 1) * size) // n


def hierarchical_allreduce_bytes(size: int, rank: int, ranks: list[int],
                                 per_node: int) -> tuple[int, int]:
    """Bytes `rank` sends and receives in the simulator's hierarchical all-reduce of `size`
    bytes among `ranks`, `per_node` consecutive ranks to a node (network.py `_allreduce`):
    a chain inside each node reduces toward its lowest rank (each of the others sends the
    tensor once), a ring among those leaders all-reduces it, and the chain broadcasts it
    back (each but the last forwards it once). Summed over the workers it is a flat ring's
    2(n-1) S: the hierarchy moves the same bytes, but between nodes only the leaders'."""
    node = [r for r in ranks if r // per_node == rank // per_node]
    at, last = node.index(rank), len(node) - 1
    if at == 0:  # the leader: receives the chain's sum, rings, starts the broadcast
        leaders = len({r // per_node for r in ranks})
        ring = ring_allreduce_bytes(size, leaders)
        return ring + size * (last > 0), ring + size * (last > 0)
    return size * (1 + (at < last)), size * (1 + (at < last))


def ring_allgather_bytes(size: int, world_size: int) -> int:
    """Bytes one worker sends when every worker's `size`-byte tensor reaches all: (n-1)*size."""
    return (world_size - 1) * size


def tree_broadcast_bytes(size: int, world_size: int, rank: int, src: int) -> int:
    """Bytes counted for a broadcast: the source sends its tensor once to each peer."""
    return size * (world_size - 1) if rank == src else 0
