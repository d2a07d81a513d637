"""The first k elements of torch.randperm(n, generator) without drawing all n (randomk's
indices): the same numbers, k draws instead of n."""

from __future__ import annotations

import torch

from fastsgd.compress import kernels


def randperm_head(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """`torch.randperm(n, generator=generator)[:k]` (int64), drawing k numbers, not n.

    torch's CPU randperm is a Fisher-Yates shuffle: step i swaps position i with
    z_i = i + r_i % (n - i), r_i the generator's i-th 32-bit number, so its first k
    elements need only k numbers (two per 64-bit draw of randint over the full int64
    range, high half first). What step i takes from z_i is z_i itself unless an earlier
    step j (the latest) swapped there, and then it is what step j found at position j;
    those chains are short and are followed by pointer jumping. Checked once against
    torch.randperm; if this torch shuffles otherwise, randperm itself is used."""
    if k == 0:
        return torch.empty(0, dtype=torch.int64)
    if not _fast_randperm_ok() or n >= 2**24:
        return torch.randperm(n, generator=generator)[:k]
    return _randperm_head(n, k, generator)


def _randperm_head(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    words = torch.randint(-2**63, 2**63 - 1, ((k + 1) // 2,), generator=generator)
    words ^= -2**63  # randint added the low end: undo it (a draw of 2^64 - 1 is misread)
    halves = words.view(torch.int32).view(-1, 2).flip(1).reshape(-1)[:k]  # high first
    draws = halves.to(torch.int64) & 0xFFFFFFFF
    if kernels.loops() is not None:  # the shuffle itself, step by step (compiled)
        out = torch.empty(k, dtype=torch.int64)
        kernels.loops().shuffle_head(n, draws.numpy(), out.numpy())
        return out
    step = torch.arange(k)
    z = step + draws % (n - step)
    sorted_z, order = torch.sort(z, stable=True)
    same = sorted_z[1:] == sorted_z[:-1]
    before = torch.full((k,), -1, dtype=torch.int64)  # latest earlier step with the same z
    before[order[1:]] = torch.where(same, order[:-1], -1)
    last = torch.cat([~same, torch.ones(1, dtype=torch.bool)])  # the last step of each z
    ends, enders = sorted_z[last], order[last]
    low = ends < k
    last_at = torch.full((k,), -1, dtype=torch.int64)  # the last step with z = position
    last_at[ends[low]] = enders[low]
    # the latest step before j that swapped into position j
    into = torch.where(last_at == step, before, last_at)
    found = torch.where(into >= 0, into, step)  # what step j finds at j: follow to the root
    while True:
        further = found[found]
        if torch.equal(further, found):
            break
        found = further
    return torch.where(before >= 0, found[before.clamp_min(0)], z)


_FAST_RANDPERM: list[bool] = []


def _fast_randperm_ok() -> bool:
    if not _FAST_RANDPERM:
        ok = True
        for n, k, seed in [(1, 1, 1), (5, 5, 2), (50, 40, 3), (1000, 999, 4), (100_003, 1001, 5)]:
            fast = _randperm_head(n, k, torch.Generator().manual_seed(seed))
            full = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k]
            ok = ok and torch.equal(fast, full)
        _FAST_RANDPERM.append(ok)
    return _FAST_RANDPERM[0]
