"""One simulated collective: what the workers bring, folded in as they arrive."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fastsgd.errors import WorkerFailed


@dataclass
class Collective:
    """One collective call, matched across workers by its sequence number. What the workers
    bring is folded in as they arrive (`combine`: "sum", "gather" or the broadcast's source
    rank), so a sum holds one result and the parts that came before their turn, not one
    copy per worker."""

    combine: str | int
    price: Callable[[], int]  # its duration (ns), asked when it starts (fabric.price)
    duration: int = 0  # ns
    result: torch.Tensor | None = None
    parts: dict[int, torch.Tensor] = field(default_factory=dict)  # not yet folded in
    summed: int = 0  # ranks 0..summed-1 are in `result`
    count: int = 0
    arrival: int = 0
    end: int | None = None
    waiting: set[int] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)  # who has arrived: who takes part
    started: bool = False  # every survivor is in: it runs, and ends at `end`
    start: int = 0  # when it runs (ns), once started
    first: tuple[int, torch.dtype, tuple[int, ...]] | None = None  # who came first, with what


def check_alike(op: Collective, seq: int, rank: int, combine: str | int,
                tensor: torch.Tensor, step: int | None = None) -> None:
    """Every worker brings the same collective (kind, dtype, shape) as the first that came;
    else worker `rank` fails (in `step`, from 1), naming both: a strategy whose collectives
    differ between workers (on gloo, the process that receives more than it expects
    aborts; one that receives less waits)."""
    brought = (tensor.dtype, tuple(tensor.shape))
    if op.first is None:
        op.first = (rank, *brought)
        return
    first, *before = op.first
    if (combine, *brought) != (op.combine, *before):
        stack = "".join(traceback.format_stack()[:-1])[-3000:]  # where the worker called it
        raise WorkerFailed(f"worker {rank} failed: collective {seq} differs between workers: "
                           f"worker {first} brought {_told(op.combine, *before)}, worker "
                           f"{rank} {_told(combine, *brought)}\nits stack (most recent call "
                           f"last):\n{stack}", rank=rank, step=step)


def _told(combine: str | int, dtype: torch.dtype, shape: tuple[int, ...]) -> str:
    kind = ("an all-reduce" if combine == "sum" else "an all-gather" if combine == "gather"
            else f"a broadcast from worker {combine}")
    return f"{kind} of {str(dtype).removeprefix('torch.')} {list(shape)}"


def fold(op: Collective, rank: int, tensor: torch.Tensor, given: bool = False) -> None:
    """`given`: the worker gives its tensor up (transport.py): kept as it is, not copied."""
    op.count += 1
    if op.combine == "gather":
        op.parts[rank] = tensor.clone()
    elif op.combine == "sum":  # in rank order, whatever the order of arrival: bitwise stable
        if rank == op.summed and op.result is not None:  # its turn: no copy needed
            op.result.add_(tensor)
            op.summed += 1
        else:
            op.parts[rank] = tensor if given else tensor.clone()
        while op.summed in op.parts:
            part = op.parts.pop(op.summed)
            op.result = part if op.result is None else op.result.add_(part)
            op.summed += 1
    elif op.combine == rank:  # the broadcast's source
        op.result = tensor.clone()


def finish_sum(op: Collective) -> None:
    """Fold in the parts still held: those that came after a rank that will never come (a
    lost worker's turn), in rank order."""
    for rank in sorted(op.parts):
        part = op.parts.pop(rank)
        op.result = part if op.result is None else op.result.add_(part)
