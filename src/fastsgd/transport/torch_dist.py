"""TorchTransport: real processes over torch.distributed (gloo on CPU, NCCL on GPU).

Collectives issued with `async_op=True` run on the process group's own communication
threads (gloo) or stream (NCCL) while the caller goes on computing: that is how the
all-reduce of one gradient bucket overlaps the backward pass of the next layers.
Bytes are counted by the same per-algorithm rules as the simulator (transport/base.py).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose: its functions take
# `group=group.WORLD` as default arguments, evaluated at import (torch 2.13). Imported later
# (torch.optim pulls it in through torch._dynamo on first use), they would hold the default
# group past destroy_process_group, and its gloo threads would live until interpreter exit.
# That is harmless only because the collectives run on a group of the transport's own
# (TorchTransport._group, see there): the default group's threads never ran one.
import torch.distributed.nn.functional  # noqa: F401

from fastsgd.control import interrupt
from fastsgd.errors import UserError
from fastsgd.transport.base import (
    Done,
    Handle,
    PeerStalled,
    nbytes,
    ring_allgather_bytes,
    ring_allreduce_bytes,
    tree_broadcast_bytes,
)
from fastsgd.transport.exchange import Exchanges
from fastsgd.transport.messages import Messenger
from fastsgd.transport.rendezvous import (
    joining_store,
    pick_backend,
    rendezvous,
)
from fastsgd.transport.roster import Roster
from fastsgd.transport.shared import shared_tensor
from fastsgd.transport.shrink import Shrinking, guarded, open_group
from fastsgd.transport.survivors import Survivors
from fastsgd.transport.torch_members import Membership
from fastsgd.transport.torch_messages import Messaging


class _Work:
    def __init__(self, work: dist.Work, guard, then: Callable[[], None] | None = None):
        self._work, self._guard, self._then = work, guard, then

    def wait(self) -> None:
        with self._guard():
            self._work.wait()
        if self._then is not None:
            self._then()
            self._then = None


class TorchTransport(Messaging, Membership):
    """One worker process of a torch.distributed job, joined through env:// rendezvous.

    MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE come from the environment (torchrun sets
    them; `Job.run` sets them for its local processes).
    """

    def __init__(self, backend: str = "auto", timeout: float = 300.0):
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
                   if k not in os.environ]
        if missing:
            raise UserError(f"torch.distributed rendezvous needs {', '.join(missing)} in the "
                            "environment (start the script with torchrun)")
        backend = pick_backend(backend)
        self.device = torch.device("cpu")
        if backend == "nccl":
            # modulo: where each process sees only its own GPU (CUDA_VISIBLE_DEVICES)
            local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
            self.device = torch.device("cuda", local)
            torch.cuda.set_device(self.device)
        # a worker that takes a lost one's place in a running job (launch.py): no group,
        # only the messenger's connections, and the launcher's store
        self.joining = interrupt.joining()  # (the step it joins at, donor, donor's since)
        self._joins_at = (self.joining or (None,))[0]
        self._joining = self._joins_at is not None
        self._owns_default_group = not dist.is_initialized() and not self._joining
        if self._owns_default_group:
            rendezvous(backend, timeout)
        # Every collective runs on this group, which only the transport holds, so close()
        # really destroys it and joins its gloo threads. The default group can be held past
        # destroy_process_group by anyone (torch.distributed.nn.functional binds it as a
        # default argument), and a gloo thread that outlives close() and frees its last
        # work at interpreter exit aborts the process ("terminate called without an active
        # exception": 8 of 60 torchrun runs on the default group, 0 of 30 on this one).
        self._group, sockets = (open_group(None, timeout=timeout) if not self._joining
                                else (None, None))
        self.backend = backend
        self._timeout = timeout
        joining = self._joining
        self.rank = int(os.environ["RANK"]) if joining else dist.get_rank()
        self.world_size = int(os.environ["WORLD_SIZE"]) if joining else dist.get_world_size()
        self._store = joining_store(timeout) if self._joining else None
        if self._joining:  # fault tests: a joiner that connects late (its peers hold for it)
            time.sleep(float(os.environ.get("FASTSGD_TEST_JOIN_DELAY", 0)))
        self.roster = Roster()
        self.bytes_sent = 0
        self.bytes_received = 0
        self._start = time.perf_counter()
        self._messenger: Messenger | None = None
        self._survivors: Survivors | None = None  # carry_on(): collectives as messages
        self._sockets = sockets  # the group's, until shrinkable() hands them to _shrinking
        self._shrinking: Shrinking | None = None  # shrinkable(): the group may shrink
        self._exchanges: Exchanges | None = None  # gossip rounds on CPU, once started
        self._step = self._joins_at or 0  # the step being computed (compute()): stamps messages
        self._received_lock = threading.Lock()
        atexit.register(self.close)  # a script that never closes, e.g. after an error

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False,
                   average: bool = False) -> Handle:
        # the sum, then the division (not ReduceOp.AVG): the bits of the simulator and gloo
        divide = (lambda: tensor.div_(len(self.members()))) if average else None
        if self._survivors:
            self._survivors.all_reduce(tensor)
        else:
            size = ring_allreduce_bytes(nbytes(tensor), self._size())
            self._count(size, size)
            with self._guard():
                work = dist.all_reduce(tensor, group=self._group, async_op=async_op)
            if async_op:
                return _Work(work, self._guard, divide)
        if divide is not None:
            divide()
        return Done()

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self._survivors:
            return self._survivors.all_gather(tensor)
        size = ring_allgather_bytes(nbytes(tensor), self._size())
        self._count(size, size)
        out = [torch.empty_like(tensor) for _ in range(self._size())]
        with self._guard():
            dist.all_gather(out, tensor, group=self._group)
        return out

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        if self._survivors:
            return self._survivors.broadcast(tensor, src)
        size = nbytes(tensor)
        members = self.members()  # the tree's positions: among the members
        self._count(tree_broadcast_bytes(size, len(members), members.index(self.rank),
                                         members.index(src)), 0 if self.rank == src else size)
        with self._guard():
            dist.broadcast(tensor, src, group=self._group)

    def send(self, tensor: torch.Tensor, dst: int) -> Handle:
        self._count(nbytes(tensor), 0)
        return _Work(dist.isend(tensor, dst, group=self._group), self._guard)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        dist.recv(tensor, src, group=self._group)
        self._count(0, nbytes(tensor))

    def exchange(self, outgoing: list[tuple[int, torch.Tensor]], sources: list[int],
                 like: torch.Tensor) -> dict[int, torch.Tensor]:
        if self.device.type == "cpu":
            received = self._exchange_by_messages(outgoing, sources, like)
        else:  # one batch, so that NCCL runs them as a group (they block one another else)
            received = {src: torch.empty_like(like) for src in sources}
            ops = [dist.P2POp(dist.irecv, b, src, self._group) for src, b in received.items()]
            ops += [dist.P2POp(dist.isend, t, dst, self._group) for dst, t in outgoing]
            for work in dist.batch_isend_irecv(ops) if ops else []:
                work.wait()
        self._count(sum(nbytes(t) for _, t in outgoing), len(sources) * nbytes(like))
        return received

    def barrier(self) -> None:
        if self._survivors:
            return self._survivors.barrier()
        with self._guard():
            dist.barrier(group=self._group, device_ids=[self.device.index]
                         if self.device.type == "cuda" else None)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """A gloo error in a group that may shrink: GroupBroken if a member died; a wait
        past run.timeout with no member dead: PeerStalled, one line."""
        try:
            with guarded(self._shrinking):
                yield
        except RuntimeError as e:
            if type(e) is RuntimeError and "timed out" in str(e).lower():
                raise PeerStalled(self.rank, self._timeout) from None
            raise

    def shrinkable(self) -> None:
        """Collective: from now on a worker's death fails every member's collective at once
        with GroupBroken (transport/shrink.py), and `shrink()` forms the survivors' group.
        For `fastsgd run`'s own workers of a synchronous strategy (run.on_failure)."""
        self.start_messages()
        self._shrinking = Shrinking(self.rank, self.world_size, self._sockets,
                                    self._require_messages().mailbox, self.store(),
                                    self._timeout)

    def shrink(self) -> list[int]:
        """Collective among the survivors after GroupBroken: their group from now on."""
        assert self._shrinking is not None, "shrink() needs shrinkable()"
        self._group = self._shrinking.shrink()  # the broken one is left as it is
        return self.members()

    def _size(self) -> int:
        return len(self._shrinking.members) if self._shrinking else self.world_size

    def shared_tensor(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """Collective: a tensor in this machine's shared memory, the same for every worker,
        starting as rank 0's `like` (for lock-free updates, Hogwild)."""
        return shared_tensor(self, name, like)

    def store(self) -> dist.Store:
        """The job's key-value store (torchrun's, or the launcher's rendezvous)."""
        return self._store or dist.distributed_c10d._get_default_store()

    def carry_on(self) -> None:
        """Collective: from now on a dead peer is a departure (members, departed, PeerLost)
        the strategy carries on without, and collectives run among the living as messages
        (survivors.py). For `fastsgd run`'s own workers of a strategy that carries on."""
        self.start_messages()
        self._survivors = Survivors(self)

    def now(self) -> float:
        if self.device.type == "cuda":  # the compute stream only: not a collective in flight
            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter() - self._start

    def off_clock(self) -> None:
        """Real time cannot be paused; kept for symmetry with the simulator."""

    def compute(self, phase: str, step: int, share: float = 1.0) -> None:
        """Real compute took the time it took: nothing to charge; the step stamps messages."""
        self._step = step

    def offload(self, work: Callable[[Callable[[], None]], Any],
                charge: Callable[[], None]) -> Any:
        return work(charge)

    def defer(self, work: Callable[[], None]) -> None:
        work()

    def await_deferred(self) -> None:
        """Nothing is deferred on real processes."""

    def close(self, failed: bool = False) -> None:
        """Stop the messenger and destroy this transport's group, and the default group if
        the transport made it (one the user made before `connect()` stays theirs). `failed`:
        this worker failed and its process ends; the launcher (or torchrun) stops its peers,
        so it says no goodbye: that would wait for the peers' goodbyes, up to the messenger's
        timeout (30 s), while they wait for this worker in a collective."""
        if self._messenger is not None and not failed:
            self._messenger.close()
        self._messenger = None
        group, self._group = self._group, None  # the last reference: destroying frees it
        if not dist.is_initialized():
            return
        if self._owns_default_group:
            dist.destroy_process_group()
        elif group is not None:
            dist.destroy_process_group(group)

    def process_group(self) -> dist.ProcessGroup:
        """The group this transport's collectives run on, for torch's own
        DistributedDataParallel (the `ddp` baseline strategy), which then says what it sent
        with `count`."""
        return self._group

    def count(self, sent: int, received: int) -> None:
        """Bytes moved on this transport's group by code other than the transport's own."""
        self._count(sent, received)

    def _count(self, sent: int, received: int) -> None:
        with self._received_lock:  # the receiver thread counts too
            self.bytes_sent += sent
            self.bytes_received += received
