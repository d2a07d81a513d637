"""Deterministic per-worker sharding of a train set: each worker's slice of every global
batch, the same batches whatever the number of workers."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import lru_cache

import torch
from torch import Tensor

from fastsgd.errors import UserError

OFFSET_SALT = 1 << 40  # window offsets draw from their own seeds, not the permutation's


@lru_cache(maxsize=8)
def _epoch_permutation(n: int, seed: int) -> Tensor:
    """The permutation of n samples seeded by `seed`, computed once per process: every
    worker of a simulated cluster (and every shard of one process) shares it, read-only, so
    1024 simulated workers hold one 8n-byte permutation, not 1024 (0.48 MB each for
    Fashion-MNIST), and draw it once per epoch, not once per worker. Eight entries cover
    workers a few epochs apart (asynchronous strategies); an evicted one is recomputed."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


@lru_cache(maxsize=8)
def _epoch_starts(n: int, stride: int, last: int, seed: int) -> Tensor:
    """Where each of n windows starts in its token stream this epoch: window i at
    i * stride plus a seeded draw in [0, stride), at most `last` (the stream's last start);
    shared like the permutation."""
    gen = torch.Generator().manual_seed(seed + OFFSET_SALT)
    starts = torch.arange(n) * stride + torch.randint(0, stride, (n,), generator=gen)
    return starts.clamp_(max=last)


class Shard:
    """One worker's view of the train set for synchronous data-parallel training.

    Epoch e permutes the whole train set with seed + e and cuts it into global batches of
    batch_size * world_size samples (the incomplete last one is dropped); worker `rank` gets
    the slice [rank * batch_size:(rank + 1) * batch_size] of each global batch.

    `tokens`, for a language model: the token stream x's windows are cut from, at a stride
    of one window less a token. Each epoch then moves every window's start by a seeded
    draw in [0, stride), so that windows fall at every offset of the text, as random windows
    do, while each epoch still covers the stream about once.

    `among(i, n)` splits the same global batches among n workers (the survivors of a run that
    lost workers): part i of n near-equal parts, so that no sample goes unseen and none twice.

    Iterating yields one epoch of batches, `batch(k)` for each of its global steps k; each
    new `iter(shard)` starts the next epoch (0, 1, 2...; set `epoch` to resume elsewhere).
    A shard holds references to x and y (the dataset is held once, whatever the number of
    shards) and shares each epoch's permutation with the other shards of the process.
    """

    def __init__(self, x: Tensor, y: Tensor, batch_size: int, rank: int, world_size: int,
                 seed: int, *, tokens: Tensor | None = None) -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserError(f"invalid worker rank {rank} for world size {world_size}")
        if batch_size < 1:
            raise UserError(f"data.batch_size must be positive, got {batch_size}")
        self.x, self.y = x, y
        self.batch_size, self.rank, self.world_size, self.seed = batch_size, rank, world_size, seed
        self._steps = len(x) // (batch_size * world_size)
        if self._steps == 0:
            raise UserError(
                f"data.batch_size {batch_size} x {world_size} workers exceeds "
                f"the {len(x)} training samples"
            )
        self._every = None if tokens is None else _every_window(tokens, x)
        self.epoch = 0  # the epoch the next iter(shard) yields
        self.part = (rank * batch_size, (rank + 1) * batch_size)  # of each global batch

    def among(self, index: int, count: int) -> Shard:
        """The same global batches, split among `count` workers: part `index` (the first
        `size % count` parts have one sample more)."""
        size = self.batch_size * self.world_size
        share, extra = divmod(size, count)
        start = index * share + min(index, extra)
        split = copy.copy(self)
        split.part = (start, start + share + (index < extra))
        return split

    @property
    def steps_per_epoch(self) -> int:
        """Number of global batches in one epoch."""
        return self._steps

    def __len__(self) -> int:
        return self._steps

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        """This worker's batches of one epoch, in order; the next iteration gets the next."""
        first = self.epoch * self._steps
        self.epoch += 1  # now, not when the generator starts: two iter() calls never share
        return (self.batch(k) for k in range(first, first + self._steps))

    def _permutation(self, epoch: int) -> Tensor:
        """The permutation of the train set for `epoch` (shared, never to be modified)."""
        return _epoch_permutation(len(self.x), self.seed + epoch)

    def batch(self, step: int) -> tuple[Tensor, Tensor]:
        """This worker's (x, y) batch for global step `step`."""
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        epoch, k = divmod(step, self._steps)
        first = k * self.batch_size * self.world_size
        idx = self._permutation(epoch)[first + self.part[0] : first + self.part[1]]
        y = self.y.index_select(0, idx)
        if self._every is not None:  # the windows at this epoch's offsets
            stride = self.x.shape[1] - 1
            starts = _epoch_starts(len(self.x), stride, len(self._every) - 1, self.seed + epoch)
            return self._every.index_select(0, starts.index_select(0, idx)), y
        # index_select: the same rows as x[idx], in half the time (a simulated worker-step)
        return self.x.index_select(0, idx), y


def _every_window(tokens: Tensor, x: Tensor) -> Tensor:
    """Every window of x's width in `tokens` (a strided view, no copy), checked to be the
    stream x's windows were cut from."""
    width = x.shape[1] if x.dim() == 2 else 0
    if tokens.dim() != 1 or width < 2 or len(tokens) < len(x) * (width - 1) + 1:
        raise UserError(f"tokens of shape {tuple(tokens.shape)} cannot be the stream of "
                        f"{tuple(x.shape)} windows: give the 1-D tokens they were cut from, "
                        "at a stride of one window less a token")
    return tokens.contiguous().as_strided((len(tokens) - width + 1, width), (1, 1))
