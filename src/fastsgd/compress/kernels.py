"""Fused CPU loops for the codecs whose torch form makes many passes over a tensor (numba;
loops.py). torch spends a pass, and on big tensors a temporary and its page faults, per
operation; a codec's encode is a dozen of them. A loop here does them all per element, in
one pass, with the same float operations in the same order, so the payloads and residuals
are the torch code's bit for bit, the bits of NaNs aside (tests/compress/test_kernels.py).

They serve float32 tensors on the CPU when numba is installed and FASTSGD_KERNELS is not
"0"; elsewhere (CUDA, float64, no numba) the codecs run their torch code. The first call
in a process compiles the loops (seconds, once) or loads them from numba's cache beside the
source (0.6 s with numba's import; docs/compression.md)."""

from __future__ import annotations

import os
import threading
from types import ModuleType

import torch

_LOOPS: list[ModuleType | None] = []

# QSGD's loop reads torch's default generator, advances it itself and writes it back: not
# atomic as torch.rand_like is. So it runs only on the main thread (the training thread;
# the simulator's workers too), and every QSGD compress, with the loop or torch.rand_like,
# holds DRAWS: a compress in a transport thread (ps answers fetches there) draws its own
# numbers. Another thread of the user's drawing from that generator at the same moment
# would draw numbers again: there, FASTSGD_KERNELS=0.
DRAWS = threading.RLock()

# torch's CPU generator state (CPUGeneratorImplState): offsets of MT19937's fields
_LEFT, _NEXT, _WORDS, _N = 8, 16, 24, 624


def loops() -> ModuleType | None:
    """The compiled loops, or None where they are off or numba is missing."""
    if not _LOOPS:
        module = None
        if os.environ.get("FASTSGD_KERNELS", "1") != "0":
            try:
                from fastsgd.compress import loops as module
            except ImportError:  # numba is optional: the torch code serves
                module = None
        _LOOPS.append(module)
    return _LOOPS[0]


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the loops serve these tensors: float32, contiguous, on the CPU, no grad."""
    return loops() is not None and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
        and not t.requires_grad for t in tensors)


def may_draw() -> bool:
    """Whether QSGD's loop may draw from torch's default generator here (see DRAWS)."""
    return threading.current_thread() is threading.main_thread()


def add_and_scan(flat: torch.Tensor, target: torch.Tensor, threshold: float,
                 capacity: int) -> tuple[torch.Tensor | None, bool]:
    """target += flat, in place; the indices (int64, increasing) of the elements of the new
    target whose magnitude is at least `threshold`, or None if more than `capacity`; and
    whether target holds a NaN."""
    found = torch.empty(max(1, capacity), dtype=torch.int64)
    count, nan = loops().add_and_scan(flat.numpy(), target.numpy(), threshold, found.numpy())
    return (found[:count] if count <= capacity else None), bool(nan)


def k_largest(target: torch.Tensor, candidates: torch.Tensor, k: int,
              take: bool) -> dict[str, torch.Tensor] | None:
    """The payload (int32 indices, increasing, and values) of the candidates (increasing
    indices) whose |target| are the k largest, with `take` subtracted from target in place;
    None, and target untouched, when the k-th and the (k+1)-th largest magnitudes are equal.
    No NaNs."""
    if candidates.numel() < k:
        return None
    indices, values = torch.empty(k, dtype=torch.int32), torch.empty(k, dtype=target.dtype)
    kept = loops().k_largest(target.numpy(), candidates.numpy(), k, indices.numpy(),
                             values.numpy(), take)
    return {"indices": indices, "values": values} if kept == k else None


def take(target: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """target[indices] (distinct indices), and target loses them: target[i] - target[i]."""
    if usable(target) and indices.device.type == "cpu":
        values = torch.empty(indices.numel(), dtype=target.dtype)
        loops().take(target.numpy(), indices.numpy(), values.numpy())
        return values
    values = target[indices]
    target[indices] = target[indices] - values
    return values


def low_rank(p: torch.Tensor, q: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """p q^T, summed term by term (k = 0, 1, ...), as a flat tensor of flat's size; flat
    becomes flat - p q^T, in place. On the CPU in one pass (a compiled loop) or its torch
    form, the same numbers; on a GPU p @ q.T (cuBLAS's sums)."""
    n, rows, cols = flat.numel(), p.shape[0], q.shape[0]
    if p.device.type != "cpu":
        approximation = (p @ q.T).reshape(-1)[:n]
        flat.sub_(approximation)
        return approximation
    p, qt = p.contiguous(), q.T.contiguous()
    if usable(p, qt, flat):
        out = torch.empty(rows, cols, dtype=flat.dtype)
        loops().low_rank(p.numpy(), qt.numpy(), flat.numpy(), out.numpy())
        return out.reshape(-1)[:n]
    out = p[:, :1] * qt[:1]
    for k in range(1, p.shape[1]):
        out += p[:, k:k + 1] * qt[k:k + 1]
    approximation = out.reshape(-1)[:n]
    flat.sub_(approximation)
    return approximation


def qsgd_planes(x: torch.Tensor, norms: torch.Tensor, levels: int, bucket: int,
                width: int) -> torch.Tensor:
    """QSGD's packed levels of x (see loops.qsgd_levels), drawing from torch's default CPU
    generator exactly what `torch.rand_like(x)` would, and leaving it where that would
    (on the main thread, holding DRAWS)."""
    n = x.numel()
    planes = torch.zeros(width, -(-n // 8), dtype=torch.uint8)
    if n == 0:
        return planes.reshape(-1)
    state = torch.get_rng_state()
    left = int(state[_LEFT:_LEFT + 4].view(torch.int32))
    start = _N if left == 1 else int(state[_NEXT:_NEXT + 8].view(torch.int64))
    words = torch.empty(2 * _N, dtype=torch.int32)
    words[:_N] = state[_WORDS:_WORDS + 8 * _N].view(torch.int64).to(torch.int32)
    position = loops().qsgd_levels(x.numpy(), norms.numpy(), levels, bucket,
                                   words.numpy().view("uint32"), start, planes.numpy())
    state[_WORDS:_WORDS + 8 * _N] = (words[:_N].to(torch.int64) & 0xFFFFFFFF).view(torch.uint8)
    state[_LEFT:_LEFT + 4] = torch.tensor([_N + 1 - position], dtype=torch.int32).view(torch.uint8)
    state[_NEXT:_NEXT + 8] = torch.tensor([position], dtype=torch.int64).view(torch.uint8)
    torch.set_rng_state(state)
    return planes.reshape(-1)
