"""Codecs alone: payload sizes, error feedback, unbiasedness, encode/decode error bounds."""

import pytest
import torch
import torch.nn.functional as F

import fastsgd as fs
from fastsgd.compress import CODECS, build_compressor
from fastsgd.compress.bits import pack_bits, unpack_bits
from fastsgd.compress.powersgd import orthonormal
from fastsgd.compress.quantize import blocks
from fastsgd.compress.wire import DTYPES, pack, unpack
from fastsgd.errors import UserError
from tests.compress.helpers import FP32, NUMEL, gradient

PAYLOAD_CODECS = [name for name in CODECS if name != "powersgd"]


def encoded_bytes(name: str, **options) -> int:
    codec = build_compressor({"name": name, **options})
    x = gradient()
    return codec.nbytes(codec.encode(x, codec.init(x)))


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8])
def test_bit_packing_round_trips_and_costs_width_bits_per_value(width):
    values = torch.randint(0, 2**width, (1001,))
    packed = pack_bits(values, width)
    assert packed.dtype == torch.uint8 and packed.numel() == width * 126
    assert torch.equal(unpack_bits(packed, 1001, width), values)


@pytest.mark.parametrize("name, limit", [("onebit", 1 / 25), ("sign", 1 / 30)])
def test_one_bit_payloads_are_a_bit_and_their_scales(name, limit):
    """onebit: a bit and 2 floats per 256 elements (1/25.6 of fp32); sign: a bit and a float
    per 512 (1/30.1)."""
    assert encoded_bytes(name) <= limit * FP32


def test_sparse_payloads_at_their_ratio():
    assert encoded_bytes("topk", ratio=0.01) <= FP32 / 40
    assert encoded_bytes("randomk", ratio=0.01) <= FP32 / 40
    assert encoded_bytes("dgc", ratio=0.001) <= FP32 / 300


def test_half_precision_payloads_are_exactly_half():
    assert encoded_bytes("fp16") == FP32 // 2
    assert encoded_bytes("bf16") == FP32 // 2


def test_qsgd_payload_has_log2_of_its_levels_bits_per_element():
    norms = 4 * -(-NUMEL // 512)
    assert encoded_bytes("qsgd", levels=1) == 2 * -(-NUMEL // 8) + norms  # {-1, 0, 1}: 2 bits
    assert encoded_bytes("qsgd", levels=127) == 8 * -(-NUMEL // 8) + norms


@pytest.mark.parametrize("name", ["onebit", "sign", "topk", "randomk", "dgc"])
def test_error_feedback_loses_nothing(name):
    """Sum of what was sent plus what is left equals the sum of what was to be sent."""
    codec = build_compressor({"name": name, **({"momentum": 0.0} if name == "dgc" else {})})
    state = codec.init(gradient())
    sent, to_send = torch.zeros(NUMEL), torch.zeros(NUMEL)
    for step in range(20):
        x = gradient(step)
        to_send += x
        sent += codec.decode(codec.encode(x, state), x)
    left = state["accumulated"] if name == "dgc" else state["residual"]
    assert torch.allclose(sent + left, to_send, atol=1e-4)
    assert sent.abs().sum() > 0


def test_dgc_momentum_correction_sends_the_accumulated_velocity():
    codec = build_compressor({"name": "dgc", "ratio": 1.0, "momentum": 0.5})
    state = codec.init(gradient())
    g = gradient()
    first = codec.decode(codec.encode(g, state), g)
    second = codec.decode(codec.encode(g, state), g)
    assert torch.allclose(first, g) and torch.allclose(second, g)  # masking restarts velocity
    codec = build_compressor({"name": "dgc", "ratio": 0.5, "momentum": 0.5})
    state = codec.init(g)
    codec.encode(g, state)
    unsent = state["accumulated"] != 0
    assert torch.allclose(state["velocity"][unsent], g[unsent])  # unsent keep momentum
    assert torch.all(state["velocity"][~unsent] == 0)


def test_dgc_warm_up_sends_fewer_elements_every_step():
    codec = build_compressor({"name": "dgc", "ratio": 0.001, "warmup_steps": 10})
    state = codec.init(gradient())
    sizes = [codec.encode(gradient(s), state)["values"].numel() for s in range(12)]
    assert sizes[0] == -(-NUMEL // 4)
    assert all(a > b for a, b in zip(sizes[:10], sizes[1:11]))
    assert sizes[10] == sizes[11] == -(-NUMEL // 1000)


def test_dgc_clips_the_local_gradient():
    codec = build_compressor({"name": "dgc", "ratio": 1.0, "momentum": 0.0, "clip": 1.0})
    x = gradient()
    assert torch.isclose(codec.decode(codec.encode(x, codec.init(x)), x).norm(),
                         torch.tensor(1.0))


def test_qsgd_is_unbiased():
    torch.manual_seed(0)
    codec = build_compressor({"name": "qsgd", "levels": 2})
    x = gradient(numel=1000)
    trials = 4000
    mean = sum(codec.decode(codec.compress(x), x) for _ in range(trials)) / trials
    # each element's estimate has variance <= (bucket norm / levels)^2 / 4: 6 sigma
    sigma = blocks(x, codec.bucket).norm(dim=1).max() / codec.levels / 2 / trials**0.5
    assert (mean - x).abs().max() < 6 * sigma
    assert (mean - x).abs().max() > 0


def test_none_is_exact():
    codec = build_compressor({"name": "none"})
    x = gradient()
    assert torch.equal(codec.decode(codec.encode(x, codec.init(x)), x), x)


@pytest.mark.parametrize("name, bound", [
    ("fp16", lambda x: 1e-3 * x.abs()), ("bf16", lambda x: 8e-3 * x.abs()),
    ("qsgd", lambda x: bucket_norms(x) / 15), ("sign", lambda x: x.abs() + x.abs().max()),
    ("onebit", lambda x: x.abs() + x.abs().max()),
    ("topk", lambda x: x.abs()), ("randomk", lambda x: x.abs()), ("dgc", lambda x: x.abs()),
])
def test_lossy_codecs_have_bounded_error(name, bound):
    codec = build_compressor({"name": name})
    x = gradient()
    error = (codec.decode(codec.compress(x), x) - x).abs()
    assert torch.all(error <= bound(x) + 1e-6)


def bucket_norms(x: torch.Tensor) -> torch.Tensor:
    """Each element's QSGD bucket norm: its error is at most that over `levels`."""
    rows = blocks(x, 512)
    return rows.norm(dim=1).repeat_interleave(rows.shape[1])[:x.numel()]


@pytest.mark.parametrize("name", ["onebit", "sign"])
def test_a_bucket_shorter_than_its_size_scales_by_its_own_elements(name):
    """A bias of 6 elements fills a 2048-element bucket with padding: the padding must not
    pull the scales towards zero (it once made onebit send ~0 for every positive element)."""
    codec = build_compressor({"name": name})
    x = torch.tensor([1.0, 2.0, -3.0, -1.0, 0.5, 4.0])
    decoded = codec.decode(codec.compress(x), x)
    if name == "onebit":  # the mean of the non-negative and of the negative elements
        expected = torch.tensor([1.875, 1.875, -2.0, -2.0, 1.875, 1.875])
    else:  # sign times the mean magnitude
        expected = torch.sign(x) * x.abs().mean()
    assert torch.allclose(decoded, expected)


def test_topk_keeps_the_largest():
    codec = build_compressor({"name": "topk", "ratio": 0.01})
    x = gradient()
    kept = codec.decode(codec.compress(x), x)
    assert kept.ne(0).sum() == -(-NUMEL // 100)
    assert kept.abs().max() == x.abs().max()
    assert x.abs()[kept == 0].max() <= kept.abs()[kept != 0].min()


@pytest.mark.parametrize("name", PAYLOAD_CODECS)
def test_payloads_cross_the_wire_as_bytes(name):
    codec = build_compressor({"name": name})
    x = gradient()
    payload = codec.compress(x)
    buffer = pack(payload)
    assert buffer.dtype == torch.uint8
    assert buffer.numel() == codec.nbytes(payload) + 8 * (1 + 2 * len(payload))
    back = unpack(buffer, codec.FIELDS)
    assert torch.equal(codec.decode(back, x), codec.decode(payload, x))


def test_a_field_of_several_tensors_packs_as_their_concatenation():
    """sgp packs a model's parameters straight into the push: the same bytes as packing
    their flat copy."""
    parts = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2)]
    weight = torch.tensor([0.5], dtype=torch.float64)
    flat = torch.cat([p.reshape(-1) for p in parts])
    assert torch.equal(pack({"values": parts, "weight": weight}),
                       pack({"values": flat, "weight": weight}))
    with pytest.raises(ValueError, match="mixes dtypes"):
        pack({"values": [torch.zeros(2), torch.zeros(2, dtype=torch.float64)]})


@pytest.mark.parametrize("values", [4, 5])  # weight's float64 aligned after 4 floats, not 5
def test_unpack_without_copy_views_the_aligned_fields_and_copies_the_rest(values):
    payload = {"values": torch.randn(values), "weight": torch.tensor([0.25], dtype=torch.float64),
               "number": torch.tensor([1, 2, 3])}
    buffer = pack(payload)
    viewed = unpack(buffer, list(payload), copy=False)
    copied = unpack(buffer, list(payload))
    for key in payload:
        assert torch.equal(viewed[key], payload[key]) and torch.equal(copied[key], payload[key])
        assert not _shares(copied[key], buffer)
    assert _shares(viewed["values"], buffer)  # 56 bytes of header: float32 aligned
    assert _shares(viewed["weight"], buffer) == (values % 2 == 0)
    assert _shares(viewed["number"], buffer) == (values % 2 == 0)


def _shares(t: torch.Tensor, buffer: torch.Tensor) -> bool:
    return t.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d is not None], ids=str)
def test_every_dtype_the_wire_carries_round_trips_bitwise(dtype):
    """A user's codec may send int8 codes, uint16 indices or float8 values."""
    raw = torch.randint(0, 256, (48,), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(1))
    values = raw.view(dtype) if dtype != torch.bool else raw % 2 == 1
    back = unpack(pack({"values": values, "scale": torch.ones(1)}), ["values", "scale"])
    assert back["values"].dtype == dtype
    assert torch.equal(back["values"].view(torch.uint8), values.view(torch.uint8))


def test_a_dtype_the_wire_does_not_carry_is_named_in_one_line():
    with pytest.raises(UserError, match="a bits8 tensor, which cannot cross the wire.*int8"):
        pack({"values": torch.zeros(4, dtype=torch.uint8).view(torch.bits8)})


def test_a_malformed_payload_names_its_sender():
    codec = build_compressor({"name": "topk"})
    buffer = pack(codec.compress(gradient()))
    with pytest.raises(UserError, match="worker 3"):
        unpack(buffer[:-5], codec.FIELDS, 3)


def test_powersgd_refuses_point_to_point_messages():
    codec = build_compressor({"name": "powersgd"})
    with pytest.raises(UserError, match="powersgd"):
        codec.compress(gradient())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_powersgd_orthonormalizes_half_precision_factors_in_float32(dtype):
    p = torch.randn(50, 4, generator=torch.Generator().manual_seed(0)).to(dtype)
    q = orthonormal(p)  # torch has no QR of its own for these dtypes
    assert q.dtype == dtype and q.shape == p.shape
    assert torch.equal(q, torch.linalg.qr(p.float()).Q.to(dtype))
    assert torch.allclose(q.float().T @ q.float(), torch.eye(4), atol=0.02)
    exact = p.float()
    assert torch.equal(orthonormal(exact), torch.linalg.qr(exact).Q)  # float32: as it was


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_powersgd_trains_a_half_precision_model(dtype, tmp_path):
    def step(model, batch):
        x, y = batch
        return F.cross_entropy(model(x.to(dtype)).float(), y)

    @torch.no_grad()
    def evaluate(model, dataset, device):
        logits = model(dataset.test_x.to(dtype)).float()
        accuracy = (logits.argmax(1) == dataset.test_y).float().mean()
        return float(accuracy), float(F.cross_entropy(logits, dataset.test_y))

    job = fs.Job(model=lambda: torch.nn.Sequential(torch.nn.Flatten(),
                                                    torch.nn.Linear(64, 10)).to(dtype),
                 step=step, evaluate=evaluate, data="synthetic", compressor="powersgd",
                 quiet=True, options={"run.steps": 3, "run.workers": 2, "compute.model": "fixed",
                                      "compute.step_time": "1ms", "compression.rank": 2,
                                      "run.out": str(tmp_path)})
    assert job.simulate().summary["steps"] == 3
    trained = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(v.dtype == dtype and bool(torch.isfinite(v).all()) for v in trained.values())
