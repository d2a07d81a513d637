"""The compiled loops (compress/kernels.py) against the torch code they replace: the same
payloads, residuals and generator state, bit for bit, with the loops on and off."""

import os
import threading

import pytest
import torch

from fastsgd.compress import build_compressor, kernels, qsgd, shuffle, sparse
from tests.compress.helpers import NUMEL, OneWorker, gradient
from tests.compress.test_fast_codecs import awkward, bitwise_equal, same_payload


@pytest.fixture
def without_loops(monkeypatch):
    def off():
        monkeypatch.setattr(kernels, "_LOOPS", [None])
    return off


def test_the_loops_serve_float32_on_the_cpu():
    """numba is a dependency: here the loops run, and checked themselves against torch,
    unless FASTSGD_KERNELS=0 turned them off."""
    if os.environ.get("FASTSGD_KERNELS") == "0":
        assert kernels.loops() is None and not kernels.usable(torch.zeros(3))
        return
    assert kernels.loops() is not None
    assert kernels.usable(torch.zeros(3))
    assert not kernels.usable(torch.zeros(3, dtype=torch.float64))
    assert not kernels.usable(torch.zeros(4)[::2])
    assert qsgd._fast_qsgd_ok() and sparse._fast_top_k_ok(torch.device("cpu"))


def encodes(name: str, numel: int, steps: int, data) -> list:
    """Payloads, residual-like state and the generator's next draws over `steps` encodes."""
    codec = build_compressor({"name": name})
    x = data(0, numel)
    state = codec.init(x)
    out = []
    for step in range(steps):
        torch.manual_seed(step)
        torch.rand(step * 311)  # the generator anywhere in its block
        payload = codec.encode(data(step, numel), state)
        out.append((payload, {k: v.clone() for k, v in state.items()}, torch.rand(4)))
    return out


def zeros_and_repeats(seed: int, numel: int) -> torch.Tensor:
    return awkward(numel, seed)


def ties(seed: int, numel: int) -> torch.Tensor:
    return (awkward(numel, seed) * 8).round() / 8  # many equal magnitudes


@pytest.mark.parametrize("name", ["onebit", "sign", "qsgd", "topk", "randomk", "dgc"])
@pytest.mark.parametrize("numel", [0, 1, 9, 4096, 4097, NUMEL, 2**20 + 3])
@pytest.mark.parametrize("data", [gradient, zeros_and_repeats, ties])
def test_the_loops_give_what_the_torch_code_gives(name, numel, data, without_loops):
    fast = encodes(name, numel, 3, data)
    without_loops()
    for (payload, state, draws), (p, s, d) in zip(fast, encodes(name, numel, 3, data)):
        same_payload(payload, p)
        assert list(state) == list(s)
        assert all(bitwise_equal(state[k].reshape(-1), s[k].reshape(-1)) for k in state)
        assert torch.equal(draws, d)  # the generator left where torch.rand_like leaves it


def test_a_nan_falls_back_to_torchs_selection(without_loops):
    x = gradient(1, 2**16)
    x[77] = float("nan")
    fast = build_compressor({"name": "topk"})
    state = fast.init(x)
    payload = fast.encode(x, state)
    without_loops()
    ref_state = fast.init(x)
    same_payload(payload, fast.encode(x, ref_state))
    assert 77 in payload["indices"].tolist()  # torch counts NaN as the largest


@pytest.mark.parametrize("draws", [0, 1, 623, 624, 625, 5000])
def test_qsgd_draws_the_generators_own_numbers(draws):
    """The loop's uniforms are torch.rand's, from any position in MT19937's block: with one
    level, an element of a constant bucket goes up when its draw is below |x| / ||x||."""
    codec = build_compressor({"name": "qsgd", "levels": 1, "bucket": 1024})
    x = torch.full((1024,), 0.5)
    fraction = x[0] / x.norm()  # 1/32, as the codec computes it
    torch.manual_seed(3)
    torch.rand(draws)
    up = codec.decode(codec.compress(x), x) > 0
    torch.manual_seed(3)
    torch.rand(draws)
    assert torch.equal(up, torch.rand(1024) < fraction)
    assert 0 < int(up.sum()) < 1024


@pytest.mark.parametrize("numel, k", [(1, 1), (10, 10), (1000, 999), (NUMEL, 2036),
                                      (2**22, 83887)])
def test_randomks_shuffle_is_torchs_with_the_loops_and_without(numel, k, without_loops):
    head = [shuffle._randperm_head(numel, k, torch.Generator().manual_seed(seed))
            for seed in (0, 5)]
    without_loops()
    for seed, fast in zip((0, 5), head):
        assert torch.equal(fast, shuffle._randperm_head(numel, k,
                                                       torch.Generator().manual_seed(seed)))
        assert torch.equal(fast, torch.randperm(numel,
                                                generator=torch.Generator().manual_seed(seed))[:k])


@pytest.mark.parametrize("numel", [4099, 4096, NUMEL])  # 4099: padded
def test_powersgds_approximation_is_the_same_with_the_loops_and_without(numel, without_loops):
    def run():
        codec, x = build_compressor({"name": "powersgd"}), gradient(0, numel)
        state = codec.init(x)
        return [(codec.all_reduce(gradient(step, numel), state, OneWorker()),
                 state["residual"].clone(), state["q"].clone()) for step in range(3)]
    fast = run()
    without_loops()
    for a, b in zip(fast, run()):
        assert all(bitwise_equal(x, y) for x, y in zip(a, b))


def test_qsgd_draws_are_its_own_when_another_thread_compresses_too():
    """ps answers fetches in a transport thread: its compresses (torch.rand_like there) and
    the main thread's (the loop) never draw the same numbers."""
    codec = build_compressor({"name": "qsgd", "levels": 1, "bucket": 2**20})
    x = torch.full((2**20,), 0.5)  # each element goes up with probability 1/1024
    codec.compress(x)  # compiled and checked before the race
    payloads: list[torch.Tensor] = []

    def compress(times: int) -> None:
        for _ in range(times):
            payloads.append(codec.compress(x)["levels"])
    other = threading.Thread(target=compress, args=(30,))
    other.start()
    compress(30)
    other.join()
    distinct = {bytes(p.numpy()) for p in payloads}
    assert len(payloads) == 60 and len(distinct) == 60


def test_the_loops_self_check_leaves_the_gpus_seed_alone(monkeypatch):
    torch.manual_seed(1)
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    monkeypatch.setattr(qsgd, "_FAST_QSGD", [])
    state = torch.get_rng_state()
    build_compressor({"name": "qsgd"}).compress(torch.zeros(10))
    assert seeded == [] and qsgd._FAST_QSGD == ([True] if kernels.loops() else [])
    assert not torch.equal(state, torch.get_rng_state())  # the compress drew, nothing else
