"""The codecs' element loops, compiled by numba (imported only through kernels.py).

Each loop does per element the float operations the torch code does, in the same order and
precision (no fastmath: no fused multiply-adds, no reassociation), so its results are the
torch code's bit for bit; what sums over many elements (norms) stays torch's."""

from __future__ import annotations

import numba
import numpy as np

N, M = 624, 397  # MT19937's state words and its middle word
UPPER, LOWER, MATRIX_A = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0x9908B0DF)
ONE, S7, S11, S15, S18 = (np.uint32(s) for s in (1, 7, 11, 15, 18))  # uint32 shifts stay 32-bit
jit = numba.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")


@jit
def add_and_scan(flat, target, threshold, found):
    """target += flat; the indices i with |target[i]| >= threshold go to `found` in order.
    Returns their count (more than found holds: only the first fit) and whether a NaN
    was seen. Branch-free: every index is written, then kept or overwritten."""
    count, last, nan = 0, found.shape[0] - 1, False
    for i in range(flat.shape[0]):
        t = target[i] + flat[i]
        target[i] = t
        a = abs(t)
        found[min(count, last)] = i
        count += a >= threshold
        nan |= a != a
    return count, nan


@jit
def twist(words):
    """words[N:2N] = the MT19937 block after words[0:N] (Matsumoto & Nishimura 1998), as the
    recurrence w[k+N] = w[k+M] ^ twist(w[k], w[k+1]), in two loops whose dependences are
    N - M apart, so that they vectorize."""
    for k in range(N - M):
        y = (words[k] & UPPER) | (words[k + 1] & LOWER)
        words[k + N] = words[k + M] ^ (y >> ONE) ^ ((words[k + 1] & ONE) * MATRIX_A)
    for k in range(N - M, N):
        y = (words[k] & UPPER) | (words[k + 1] & LOWER)
        words[k + N] = words[k + M] ^ (y >> ONE) ^ ((words[k + 1] & ONE) * MATRIX_A)


@jit
def temper(y):
    y ^= y >> S11
    y ^= (y << S7) & np.uint32(0x9D2C5680)
    y ^= (y << S15) & np.uint32(0xEFC60000)
    return y ^ (y >> S18)


CHUNK = 8192  # elements per round of draws, levels and packing (a multiple of 8)
ONES, GATHER = np.uint64(0x0101010101010101), np.uint64(0x8040201008040201)
LOW24 = np.uint32(0xFFFFFF)


@jit
def level_run(x, words, norm, step, values):
    """QSGD's levels of a run of x in one bucket, each drawing one word of `words`; the
    indices start at 0 so that numba knows them non-negative and the loop vectorizes."""
    unit = np.float32(1.0 / (1 << 24))
    for j in range(x.shape[0]):
        u = np.float32(np.int32(temper(words[j]) & LOW24)) * unit
        v = x[j]
        scaled = (abs(v) / norm) * step
        level = np.floor(scaled)
        up = np.float32(1.0) if u < scaled - level else np.float32(0.0)
        sign = np.float32((v > 0) - (v < 0))
        values[j] = np.uint8((level + up) * sign + step)


@jit
def qsgd_levels(x, norms, levels, bucket, words, start, planes):
    """QSGD's signed levels + `levels` of the elements of x (float32), packed into the bit
    planes `planes` (uint8, width x ceil(n / 8), the first element of a byte in its top
    bit), as QSGD.compress computes them with the uniform draws torch.rand_like(x) would
    make: one MT19937 output per element, its low 24 bits times 2^-24.

    `words` (uint32, 2N) holds the generator's block in words[0:N] and `start` is the index
    of its next output (N: twist first). Returns the index after the last draw, words[0:N]
    the block it is in."""
    step = np.float32(levels)
    values = np.zeros(CHUNK, np.uint8)
    words64 = values.view(np.uint64)
    position = start
    for first in range(0, x.shape[0], CHUNK):
        count = min(CHUNK, x.shape[0] - first)
        i = 0
        while i < count:  # runs of one generator block and one bucket: vectorized loops
            if position == N:
                twist(words)
                words[:N] = words[N:]
                position = 0
            at = first + i
            end = min(count, i + N - position, i + bucket - at % bucket)
            level_run(x[at:first + end], words[position:position + end - i],
                      norms[at // bucket], step, values[i:end])
            position += end - i
            i = end
        values[count:] = 0
        for p in range(planes.shape[0]):
            for b in range((count + 7) // 8):
                planes[p, first // 8 + b] = np.uint8(((words64[b] >> p) & ONES) * GATHER >> 56)
    return position


@jit
def k_largest(target, candidates, k, indices, values, take):
    """The candidates (increasing) whose |target| (float32, no NaN) are the k largest: their
    indices (int32) and values go to `indices` and `values`, and with `take` target loses
    them (target[i] - values[i], in place). Returns how many candidates are at least the
    k-th largest: k, or more on a tie, and then nothing is written. A magnitude's bit
    pattern is the float's with the sign bit cleared; those are ordered as the floats."""
    count, bits = candidates.shape[0], target.view(np.int32)
    picked = np.empty(count, np.int64)
    for j in range(count):
        picked[j] = bits[candidates[j]] & 0x7FFFFFFF
    kth = kth_largest(picked, k)
    kept = 0
    for j in range(count):
        kept += picked[j] >= kth
    if kept != k:
        return kept
    m = 0
    for j in range(count):
        if picked[j] >= kth:
            i = candidates[j]
            indices[m], values[m] = i, target[i]
            if take:
                target[i] = target[i] - values[m]
            m += 1
    return kept


@jit
def kth_largest(values, k):
    """The k-th largest of non-negative 31-bit integers: a radix select, 11 + 10 + 10 bits."""
    prefix = 0
    for shift, width in ((20, 11), (10, 10), (0, 10)):
        counts = np.zeros(1 << width, np.int64)
        high = -(1 << (shift + width))  # the bits above this digit, which must be prefix's
        for v in values:
            if v & high == prefix:
                counts[(v >> shift) & ((1 << width) - 1)] += 1
        digit = (1 << width) - 1
        while counts[digit] < k:
            k -= counts[digit]
            digit -= 1
        prefix |= digit << shift
    return prefix


@jit
def shuffle_head(n, draws, out):
    """out = the first k (= len(out)) elements of the Fisher-Yates shuffle of 0..n-1
    (n < 2^31) that swaps position i with i + draws[i] % (n - i), as torch.randperm does.
    The positions it moved are kept in an open-addressing table, a position and what it
    holds in one int64 (the rest hold their own index)."""
    k = out.shape[0]
    size = 1 << max(4, int(np.ceil(np.log2(4 * k + 1))))
    table, mask = np.full(size, -1, np.int64), size - 1
    for i in range(k):
        z = i + np.int64(draws[i]) % (n - i)
        si = slot(table, i, mask)
        vi = table[si] & 0xFFFFFFFF if table[si] != -1 else i
        sz = slot(table, z, mask)
        vz = table[sz] & 0xFFFFFFFF if table[sz] != -1 else z
        table[sz] = (z << 32) | vi
        table[slot(table, i, mask)] = (i << 32) | vz  # z's entry may have taken i's slot
        out[i] = vz
    return out


@jit
def slot(table, key, mask):
    """Where key is in the table, or the free slot where it would go (linear probing)."""
    at = (key * np.int64(-7046029254386353131)) >> np.int64(20) & mask
    while table[at] != -1 and table[at] >> 32 != key:
        at = (at + 1) & mask
    return at


@jit
def count_nonnegative(target, bucket, counts):
    """counts[b] = how many elements of bucket b of target are >= 0 (NaN is not)."""
    for b in range(counts.shape[0]):
        run = target[b * bucket:min(target.shape[0], (b + 1) * bucket)]
        count = 0
        for i in range(run.shape[0]):
            count += run[i] >= 0
        counts[b] = count


@jit
def subtract_by_sign(target, high, low, bucket, bits):
    """The sign flags (>= 0; NaN is not) of target packed into `bits` (the first element of
    a byte in its top bit), then target -= high[b] where the flag is set, else low[b], b the
    element's bucket: a one-bit codec's payload bits and error-feedback residual."""
    n = target.shape[0]
    for j in range(n // 8):
        byte = 0
        for e in range(8):
            byte |= (target[8 * j + e] >= 0) << (7 - e)
        bits[j] = byte
    if n % 8:
        byte = 0
        for e in range(n % 8):
            byte |= (target[n - n % 8 + e] >= 0) << (7 - e)
        bits[n // 8] = byte
    for b in range(high.shape[0]):
        run = target[b * bucket:min(n, (b + 1) * bucket)]
        up, down = high[b], low[b]
        for i in range(run.shape[0]):
            t = run[i]
            run[i] = t - (up if t >= 0 else down)


@jit
def low_rank(p, qt, flat, out):
    """out = p qt as the sum over k = 0, 1, ... of p[:, k] qt[k] (each term rounded, then
    added: no fused multiply-adds), row by row; flat -= out over flat's n <= rows * cols
    elements (the matrix's padding is not in flat)."""
    rows, rank = p.shape
    cols, n = qt.shape[1], flat.shape[0]
    for i in range(rows):
        row = out[i]
        for j in range(cols):
            row[j] = p[i, 0] * qt[0, j]
        for k in range(1, rank):
            a, terms = p[i, k], qt[k]
            for j in range(cols):
                row[j] = row[j] + a * terms[j]
        rest = flat[i * cols:min(n, (i + 1) * cols)]
        for j in range(rest.shape[0]):
            rest[j] = rest[j] - row[j]


@jit
def take(target, indices, values):
    """values = target[indices]; target[i] -= values (one access per index)."""
    for m in range(indices.shape[0]):
        i = indices[m]
        v = target[i]
        values[m] = v
        target[i] = v - v
