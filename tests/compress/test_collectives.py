"""Compressed all-reduce among 4 simulated workers: network bytes per worker, and results."""

import pytest
import torch

from fastsgd.compress import build_compressor
from fastsgd.compress.collectives import all_reduce_mean, init_all_reduce
from fastsgd.compress.qsgd import QSGD
from fastsgd.compress.wire import pack, pack_rows, unpack, unpack_rows
from fastsgd.errors import UserError
from fastsgd.transport.base import ring_allreduce_bytes
from fastsgd.transport.sim import simulate
from tests.compress.helpers import FP32, NUMEL, gradient
from tests.strategies.helpers import params, sim_job

WORKERS = 4


def reduce_on_sim(name: str, steps: int = 1, with_states: bool = False, **options):
    """Each worker all-reduces its own gradient `steps` times; (results, bytes sent) per
    worker, and with `with_states` the codec state each worker ends with."""
    codec = build_compressor({"name": name, **options})

    def worker(t):
        state = init_all_reduce(codec, gradient(), WORKERS)
        results = [all_reduce_mean(gradient(100 * step + t.rank), codec, state, t)
                   for step in range(steps)]
        worker.states.append((t.rank, state))
        return torch.stack(results), t.bytes_sent / steps

    worker.states = []
    if with_states:
        return simulate(WORKERS, worker), dict(worker.states)

    return simulate(WORKERS, worker)


def true_mean(step: int = 0) -> torch.Tensor:
    return sum(gradient(100 * step + r) for r in range(WORKERS)) / WORKERS


@pytest.mark.parametrize("name, options, fraction", [
    ("onebit", {}, 1 / 24), ("sign", {}, 1 / 28), ("topk", {"ratio": 0.01}, 1 / 20),
    ("dgc", {"ratio": 0.001}, 1 / 200), ("fp16", {}, 1 / 2 + 1e-3),
    ("powersgd", {"rank": 4}, 1 / 25), ("powersgd", {}, 1 / 12.5),
])
def test_network_bytes_per_step_shrink_by_the_codec_factor(name, options, fraction):
    uncompressed = ring_allreduce_bytes(FP32, WORKERS)
    for _, sent in reduce_on_sim(name, **options):
        assert sent <= fraction * uncompressed


def test_uncompressed_all_reduce_sends_the_ring_bytes():
    for _, sent in reduce_on_sim("none"):
        assert sent == ring_allreduce_bytes(FP32, WORKERS)


@pytest.mark.parametrize("name", ["none", "fp16", "bf16", "onebit", "sign", "qsgd", "topk",
                                  "randomk", "dgc", "powersgd"])
def test_every_worker_gets_the_same_mean(name):
    results = [r for r, _ in reduce_on_sim(name, steps=3)]
    for other in results[1:]:
        assert torch.equal(other, results[0])


@pytest.mark.parametrize("name, options, tolerance", [
    ("none", {}, 1e-6), ("fp16", {}, 2e-3), ("topk", {"ratio": 1.0}, 1e-6),
    ("randomk", {"ratio": 1.0}, 1e-6), ("qsgd", {"levels": 127}, 0.2),
])
def test_the_mean_is_exact_or_close(name, options, tolerance):
    result, _ = reduce_on_sim(name, **options)[0]
    error = (result[0] - true_mean()).norm() / true_mean().norm()
    assert error < tolerance


@pytest.mark.parametrize("name", ["onebit", "sign", "qsgd", "topk", "dgc", "powersgd"])
def test_error_feedback_in_the_collective_loses_nothing(name):
    """n * (sum of the means every worker got) + what every worker still holds back equals
    the sum of every gradient: at the scatter stage each worker keeps a residual per chunk;
    at the gather stage each chunk's owner keeps one for the chunk's mean (hence n times)."""
    steps, options = 10, {"momentum": 0.0} if name == "dgc" else {}
    if name == "qsgd":
        options["error_feedback"] = True
    runs, states = reduce_on_sim(name, steps=steps, with_states=True, **options)
    held = torch.zeros(NUMEL)
    for rank, state in states.items():
        if "scatter" in state:
            chunk = state["gather"]["residual"].numel()
            held += torch.cat([s["residual"] for s in state["scatter"]])[:NUMEL]
            owned = torch.zeros(chunk * WORKERS)
            owned[rank * chunk:(rank + 1) * chunk] = WORKERS * state["gather"]["residual"]
            held += owned[:NUMEL]
        else:
            held += state["accumulated"] if name == "dgc" else state["residual"]
    sent = WORKERS * runs[0][0].sum(0)
    truth = WORKERS * sum(true_mean(s) for s in range(steps))
    assert torch.allclose(sent + held, truth, atol=1e-3)


@pytest.mark.parametrize("name", ["onebit", "sign", "fp16", "bf16", "qsgd"])
@pytest.mark.parametrize("numel", [1, 7, 255, 256, 257, 1000, 3001])
def test_payloads_decoded_as_rows_are_each_payloads_own_bits(name, numel):
    """decode_rows (all workers' chunks at once) against decode, one payload at a time:
    the same bits, zeros' signs included, whether or not buckets and bytes divide the
    chunk."""
    codec = build_compressor({"name": name})
    codec.error_feedback = False  # compress: each payload alone
    like = torch.zeros(numel)
    tensors = [torch.randn(numel) * 10.0 ** (k - 1) for k in range(3)]
    tensors[1][: numel // 2] = 0.0
    tensors[2][::3] = -0.0
    buffers = [pack(codec.compress(t)) for t in tensors]
    rows = codec.decode_rows(unpack_rows(buffers, codec.FIELDS), like)
    assert rows.shape == (3, numel)
    for row, buffer in zip(rows, buffers):
        alone = codec.decode(unpack(buffer, codec.FIELDS), like)
        assert torch.equal(row.view(torch.int32), alone.view(torch.int32))


def test_buffers_of_other_layouts_are_not_stacked():
    codec = build_compressor({"name": "onebit"})
    short, long = (pack(codec.compress(torch.randn(n))) for n in (100, 300))
    assert unpack_rows([short, long], codec.FIELDS) is None
    with pytest.raises(UserError, match="worker 2"):
        unpack_rows([short[:-5], short[:-5]], codec.FIELDS, 2)


@pytest.mark.parametrize("name, error_feedback", [
    ("onebit", True), ("onebit", False), ("sign", True), ("sign", False), ("fp16", False),
    ("bf16", False), ("qsgd", False), ("qsgd", True)])
@pytest.mark.parametrize("numel", [1, 7, 255, 256, 257, 1000, 3001])
def test_chunks_encoded_as_rows_are_each_chunks_own_payload_and_residual(numel, name,
                                                                        error_feedback):
    codec = build_compressor({"name": name, **({"error_feedback": error_feedback}
                                               if error_feedback else {})})
    codec.error_feedback = error_feedback
    chunks = torch.randn(3, numel) * torch.tensor([[0.1], [1.0], [10.0]])
    chunks[1, : numel // 2] = 0.0
    states = [codec.init(chunks[0]) for _ in range(3)]
    for k, state in enumerate(states[1:] if error_feedback else []):  # left by earlier steps
        state["residual"] += torch.randn(numel) * (k + 1)
    alone = [dict(s, **{k: v.clone() for k, v in s.items()}) for s in states]
    torch.manual_seed(5)  # qsgd draws: one draw for the rows, then one per chunk
    rows = codec.encode_rows(chunks, states)
    drawn_next = torch.rand(2)
    torch.manual_seed(5)
    expected_rows = [codec.encode(chunk, own) for chunk, own in zip(chunks, alone)]
    assert torch.equal(torch.rand(2), drawn_next)  # the generator left where they leave it
    buffers = pack_rows(rows)
    for r, (state, own, expected) in enumerate(zip(states, alone, expected_rows)):
        assert rows.keys() == expected.keys()
        assert all(torch.equal(rows[k][r], expected[k]) for k in expected)
        assert torch.equal(buffers[r], pack(expected))
        assert state.keys() == own.keys()
        assert all(torch.equal(state[k].view(torch.int32), own[k].view(torch.int32))
                   for k in own)


@pytest.mark.parametrize("name, one_at_a_time", [
    ("onebit", ["decode_rows"]), ("onebit", ["encode_rows"]),
    ("onebit", ["decode_rows", "encode_rows"]), ("sign", ["decode_rows"]),
    ("sign", ["encode_rows"]), ("fp16", ["decode_rows", "encode_rows"])])
def test_the_all_reduce_on_rows_gives_the_bits_of_one_chunk_at_a_time(name, one_at_a_time,
                                                                    monkeypatch):
    """Results, bytes and the codec states workers end with (their residuals). (qsgd draws
    random numbers, in an order these bare simulated workers do not fix: the next test.)"""
    (batched, states) = reduce_on_sim(name, steps=3, with_states=True)
    for attribute in one_at_a_time:
        owner = next(c for c in type(build_compressor({"name": name})).__mro__
                     if attribute in vars(c))
        monkeypatch.delattr(owner, attribute)
    (alone, alone_states) = reduce_on_sim(name, steps=3, with_states=True)
    for (a, sent_a), (b, sent_b) in zip(batched, alone):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)) and sent_a == sent_b
    for rank, state in states.items():
        for a, b in zip(state["scatter"] + [state["gather"]],
                        alone_states[rank]["scatter"] + [alone_states[rank]["gather"]]):
            assert a.keys() == b.keys()
            assert all(torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)) for k in a)


@pytest.mark.parametrize("error_feedback", [False, True])
def test_qsgd_runs_on_rows_train_the_model_of_chunk_by_chunk(error_feedback, synthetic,
                                                             tmp_path, monkeypatch):
    """A simulated run (seeded: its draws come in a fixed order), with and without the
    row forms: the same parameters, bit for bit."""
    def trained(out):
        job = sim_job(synthetic, tmp_path / out, {"name": "allreduce"}, steps=15,
                      **{"compression.name": "qsgd",
                         "compression.error_feedback": error_feedback})
        return params(job.simulate(4))

    rows = trained("rows")
    monkeypatch.delattr(QSGD, "encode_rows")
    monkeypatch.delattr(QSGD, "decode_rows")
    alone = trained("alone")
    assert all(torch.equal(rows[k], alone[k]) for k in rows)
