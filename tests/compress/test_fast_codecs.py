"""The fast codecs against the codecs as they were before they were made fast
(benchmarks/codec_speed.py): the same payloads, bit for bit, and the same decoded tensors and
residuals (topk and dgc: the same elements, docs/compression.md)."""

import pytest
import torch

from fastsgd.compress import build_compressor, quantize, shuffle, sparse
from fastsgd.compress.base import Codec
from fastsgd.compress.bits import pack_bits, unpack_bits
from fastsgd.compress.powersgd import products, shape_of
from fastsgd.compress.qsgd import QSGD
from fastsgd.compress.quantize import OneBit, Sign, blocks
from fastsgd.compress.sparse import RandomK, TopK, kept
from tests.compress.helpers import NUMEL, OneWorker, gradient

# The codecs as they were before they were made fast (benchmarks/codec_speed.py): the fast
# ones must give the same payloads, bit for bit, and the same decoded tensors and residuals.

_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def reference_pack_bits(values: torch.Tensor, width: int = 1) -> torch.Tensor:
    n = values.numel()
    padded = torch.zeros(width, (n + 7) // 8 * 8, dtype=torch.uint8)
    v = values.reshape(-1).to(torch.int64)
    for plane in range(width):
        padded[plane, :n] = ((v >> plane) & 1).to(torch.uint8)
    return (padded.view(width, -1, 8) * _WEIGHTS).sum(-1, dtype=torch.uint8).reshape(-1)


def reference_unpack_bits(packed: torch.Tensor, n: int, width: int = 1) -> torch.Tensor:
    planes = (packed.view(width, -1, 1) & _WEIGHTS).ne(0).reshape(width, -1)[:, :n]
    shifts = torch.arange(width).view(-1, 1)
    return (planes.to(torch.int64) << shifts).sum(0)


class ReferenceOneBit(OneBit):
    def compress(self, tensor):
        rows = blocks(tensor, self.bucket)
        real = blocks(torch.ones_like(tensor.reshape(-1), dtype=torch.bool), self.bucket)
        positive = rows >= 0
        negative = ~positive & real
        positive &= real
        high = (rows * positive).sum(1) / positive.sum(1).clamp_min(1)
        low = (rows * negative).sum(1) / negative.sum(1).clamp_min(1)
        bits = positive.reshape(-1)[:tensor.numel()]
        return {"bits": reference_pack_bits(bits),
                "means": torch.stack([high, low], 1).float().reshape(-1)}

    def decode(self, payload, like):
        positive = reference_unpack_bits(payload["bits"], like.numel()).bool()
        means = payload["means"].to(like.dtype).view(-1, 2).repeat_interleave(self.bucket, 0)
        means = means[:like.numel()]
        return torch.where(positive, means[:, 0], means[:, 1]).view_as(like)

    encode = Codec.encode  # compress, then decode for the residual


class ReferenceSign(Sign):
    def compress(self, tensor):
        x = tensor.reshape(-1)
        rows = blocks(x, self.bucket)
        last = x.numel() - (rows.shape[0] - 1) * self.bucket
        sizes = torch.full((rows.shape[0],), float(self.bucket), dtype=x.dtype)
        sizes[-1] = last
        return {"bits": reference_pack_bits(x >= 0),
                "scales": (rows.abs().sum(1) / sizes).float()}

    def decode(self, payload, like):
        positive = reference_unpack_bits(payload["bits"], like.numel()).bool()
        scale = payload["scales"].to(like.dtype).repeat_interleave(self.bucket)[:like.numel()]
        return torch.where(positive, scale, -scale).view_as(like)

    encode = Codec.encode


class ReferenceQSGD(QSGD):
    def compress(self, tensor):
        x = tensor.reshape(-1)
        rows = blocks(x, self.bucket)
        norms = rows.norm(dim=1, keepdim=True).float()
        tiny = torch.finfo(torch.float32).tiny
        scaled = (rows.abs() / norms.clamp_min(tiny) * self.levels).reshape(-1)[:x.numel()]
        lower = scaled.floor()
        level = lower + (torch.rand_like(scaled) < scaled - lower).to(scaled.dtype)
        signed = (torch.sign(x) * level).to(torch.int64) + self.levels
        return {"norms": norms.reshape(-1), "levels": reference_pack_bits(signed, self.width)}

    def decode(self, payload, like):
        signed = reference_unpack_bits(payload["levels"], like.numel(), self.width)
        signed = signed - self.levels
        scale = payload["norms"].to(like.dtype).repeat_interleave(self.bucket) / self.levels
        return (signed.to(like.dtype) * scale[:like.numel()]).view_as(like)


def awkward(numel: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """A gradient with exact zeros, negative zeros, repeated values and an all-negative run."""
    x = gradient(seed, numel).to(dtype)
    x[::7] = 0.0
    x[3::11] = -0.0
    x[5::13] = 0.25
    x[:min(numel, 3000)] = -x[:min(numel, 3000)].abs() - 1e-3
    return x


def same_payload(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key].view(torch.uint8) if a[key].dtype.is_floating_point
                           else a[key], b[key].view(torch.uint8)
                           if b[key].dtype.is_floating_point else b[key]), key


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


SIZES = [1, 6, 8, 9, 511, 512, 2047, 2048, 2049, 3 * 2048 + 8, NUMEL,
         2 * 2**18 + 2049]  # (several of encode's runs, quantize.RUN)


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 9, 13])
@pytest.mark.parametrize("numel", [1, 7, 8, 9, 1001, 4096])
def test_bit_packing_matches_the_per_bit_reference(width, numel):
    values = torch.randint(0, 2**width, (numel,), generator=torch.Generator().manual_seed(width))
    packed = pack_bits(values, width)
    assert torch.equal(packed, reference_pack_bits(values, width))
    assert torch.equal(unpack_bits(packed, numel, width), values)
    if width == 1:
        assert torch.equal(pack_bits(values.bool()), packed)
        assert torch.equal(pack_bits(values.bool()[1:]), reference_pack_bits(values[1:]))
    if width <= 8:
        assert torch.equal(pack_bits(values.to(torch.uint8), width), packed)


@pytest.mark.parametrize("name, reference", [("onebit", ReferenceOneBit),
                                             ("sign", ReferenceSign), ("qsgd", ReferenceQSGD)])
@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_quantizers_match_the_reference(name, reference, numel, dtype):
    codec, ref = build_compressor({"name": name}), reference()
    x = awkward(numel, dtype=dtype)
    torch.manual_seed(1)
    payload = codec.compress(x)
    torch.manual_seed(1)
    same_payload(payload, ref.compress(x))
    assert bitwise_equal(codec.decode(payload, x), ref.decode(payload, x))
    if codec.error_feedback:  # encode's residual, over a few steps
        state, ref_state = codec.init(x), ref.init(x)
        for step in range(3):
            g = awkward(numel, step, dtype)
            same_payload(codec.encode(g, state), ref.encode(g, ref_state))
            assert bitwise_equal(state["residual"], ref_state["residual"])


@pytest.mark.parametrize("name", ["onebit", "sign"])
@pytest.mark.parametrize("bucket", [100, 256, 2**18 + 3])
def test_encoding_in_runs_is_encoding_at_once(name, bucket, monkeypatch):
    """Runs of whole buckets and whole bytes of flags: the same payloads and residuals as
    one pass, whatever the bucket (100: runs of lcm(100, 8) elements)."""
    x = [awkward(3 * 2**18 + 37, step) for step in range(3)]
    results = []
    for run in (2**18, 2**30):  # in runs, then at once
        monkeypatch.setattr(quantize, "RUN", run)
        codec = build_compressor({"name": name, "bucket": bucket})
        state = codec.init(x[0])
        results.append([(codec.encode(g, state), state["residual"].clone()) for g in x])
    for (runs, residual), (once, whole) in zip(*results):
        same_payload(runs, once)
        assert bitwise_equal(residual, whole)


class ReferenceTopK(TopK):
    def compress(self, tensor):
        x = tensor.reshape(-1)
        indices = x.abs().topk(kept(x.numel(), self.ratio), sorted=False).indices
        return {"indices": indices.to(torch.int32), "values": x[indices]}

    encode = Codec.encode


class ReferenceRandomK(RandomK):
    def _indices(self, seed, like):
        generator = torch.Generator().manual_seed(seed)
        return torch.randperm(like.numel(), generator=generator)[:kept(like.numel(), self.ratio)]

    encode = Codec.encode


def by_index(payload: dict) -> dict:
    """A sparse payload with its pairs in the order of their indices."""
    order = payload["indices"].argsort()
    return {"indices": payload["indices"][order], "values": payload["values"][order]}


@pytest.mark.parametrize("numel", [1, 100, 4096, 5000, NUMEL, 2**18])
@pytest.mark.parametrize("ratio", [0.001, 0.01, 1 / 64, 0.02, 0.05, 0.1])
@pytest.mark.parametrize("data", ["normal", "ties"])
def test_fast_topk_selects_as_torch_topk(numel, ratio, data):
    """The same elements as torch.topk, so the same decoded tensor and residual; where the
    fast path is taken (up to 2%, topk's default, and beyond, to n / 16), in the order of
    their indices."""
    codec, ref = TopK(ratio), ReferenceTopK(ratio)
    x = awkward(numel) if data == "ties" else gradient(3, numel)
    if data == "ties":
        x = (x * 64).round() / 64
    payload, expected = codec.compress(x), ref.compress(x)
    same_payload(by_index(payload), by_index(expected))
    k = expected["indices"].numel()
    fast = sparse._top_k_fast(x.abs(), k)
    if data == "normal" and numel >= 4096 and k * 16 <= numel:
        assert fast is not None
    if fast is not None:
        assert torch.equal(payload["indices"].long(), fast)
        assert bool((fast[1:] > fast[:-1]).all())
    assert bitwise_equal(codec.decode(payload, x), ref.decode(expected, x))
    state, ref_state = codec.init(x), ref.init(x)
    for step in range(3):
        g = gradient(step, numel)
        same_payload(by_index(codec.encode(g, state)), by_index(ref.encode(g, ref_state)))
        assert bitwise_equal(state["residual"], ref_state["residual"])


def test_fast_topk_is_taken_and_picks_torch_topks_elements():
    m = torch.randperm(2**18, generator=torch.Generator().manual_seed(5)).float()
    fast = sparse._top_k_fast(m, 2622)
    assert fast is not None and sparse._fast_top_k_ok(m.device)
    assert torch.equal(fast, m.topk(2622, sorted=False).indices.sort().values)


@pytest.mark.parametrize("numel, k", [(1, 1), (2, 2), (10, 3), (50, 50), (1000, 999),
                                      (NUMEL, 1018), (2**20, 10486), (2**24 - 1, 2000)])
def test_randperm_head_is_the_head_of_torch_randperm(numel, k):
    for seed in (0, 1, 2**62 - 1, 123456789):
        fast = shuffle._randperm_head(numel, k, torch.Generator().manual_seed(seed))
        full = torch.randperm(numel, generator=torch.Generator().manual_seed(seed))[:k]
        assert torch.equal(fast, full)
    assert shuffle._fast_randperm_ok()


@pytest.mark.parametrize("numel", [1, 100, NUMEL])
def test_fast_randomk_matches_the_reference(numel):
    codec, ref = RandomK(), ReferenceRandomK()
    x = awkward(numel)
    torch.manual_seed(4)
    payload = codec.compress(x)
    torch.manual_seed(4)
    same_payload(payload, ref.compress(x))
    assert bitwise_equal(codec.decode(payload, x), ref.decode(payload, x))
    state, ref_state = codec.init(x), ref.init(x)
    for step in range(3):
        g = gradient(step, numel)
        torch.manual_seed(step)
        payload = codec.encode(g, state)
        torch.manual_seed(step)
        same_payload(payload, ref.encode(g, ref_state))
        assert bitwise_equal(state["residual"], ref_state["residual"])


def reference_powersgd(codec, tensor, state):
    flat = tensor.reshape(-1) + state["residual"]
    rows, cols = shape_of(flat.numel())
    matrix = torch.zeros(rows * cols, dtype=flat.dtype)
    matrix[:flat.numel()] = flat
    matrix = matrix.view(rows, cols)
    # matrix @ q and matrix^T @ p as (q^T matrix^T)^T and (p^T matrix)^T: the same products,
    # in the summation order the codec's BLAS calls take (test_powersgd_products_...), made
    # contiguous as the codec's are: on an AVX-512 Xeon, MKL rounds a QR or a product of a
    # transposed (column-major) operand differently
    p = torch.linalg.qr((state["q"].T @ matrix.T).T.contiguous()).Q
    q = (p.T @ matrix).T.contiguous()
    state["q"] = q
    # p q^T summed rank by rank in order, each product rounded before it is added (the
    # same numbers on the CPU with the loops and without)
    approximation = sum((torch.outer(p[:, k], q[:, k]) for k in range(1, q.shape[1])),
                        torch.outer(p[:, 0], q[:, 0])).reshape(-1)[:flat.numel()]
    state["residual"] = flat - approximation
    return approximation.view_as(tensor)


@pytest.mark.parametrize("numel", [4099, 4096, NUMEL])  # 4099: padded
def test_powersgd_matches_the_reference(numel):
    codec = build_compressor({"name": "powersgd"})
    x = gradient(0, numel)
    state, ref_state = codec.init(x), codec.init(x)
    for step in range(3):
        g = gradient(step, numel)
        out = codec.all_reduce(g, state, OneWorker())
        assert bitwise_equal(out, reference_powersgd(codec, g, ref_state))
        assert bitwise_equal(state["residual"], ref_state["residual"])
        assert bitwise_equal(state["q"], ref_state["q"])


@pytest.mark.parametrize("rows, cols", [(3, 3), (64, 64), (512, 512), (513, 512)])
def test_powersgd_products_are_the_matrix_products(rows, cols):
    """Within the forward error bound of a float32 dot product of `inner` terms,
    inner * eps * (|A| |B|), of the float64 product, as matrix @ factor itself is."""
    matrix = gradient(1, rows * cols).view(rows, cols)
    for a, b in [(matrix, gradient(2, cols * 8).view(cols, 8)),
                 (matrix.T, gradient(3, rows * 4).view(rows, 4))]:
        fast = products(a, b)
        assert fast.is_contiguous() and fast.shape == (a.shape[0], b.shape[1])
        exact = a.double() @ b.double()
        bound = a.shape[1] * torch.finfo(torch.float32).eps * (a.abs().double() @ b.abs().double())
        assert bool(((fast.double() - exact).abs() <= bound).all())
        assert bool((((a @ b).double() - exact).abs() <= bound).all())
