"""SparseLoCo: error feedback and the outer step against plain torch, the bytes it sends,
buffers, a lost worker, bad input, the conformance suite and a GPT."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import fastsgd as fs
from fastsgd.compress import build_compressor
from fastsgd.strategies.lowcomm.sparseloco import SparseLoCo
from fastsgd.transport.sim import simulate
from tests.strategies.helpers import refused_in_one_line, sim_job

PATH = "sparseloco"


def tiny_model() -> torch.nn.Module:
    """Four parameter tensors of 12, 4, 8 and 2 elements, in float64."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 2)).double()


def inner_step(model, optimizer, rank, step) -> None:
    gen = torch.Generator().manual_seed(100 * step + rank)
    x, y = (torch.randn(5, 3, generator=gen, dtype=torch.float64),
            torch.randn(5, 2, generator=gen, dtype=torch.float64))
    optimizer.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    optimizer.step()


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def rounds(steps: int, move, model=tiny_model, **settings) -> list[list[dict]]:
    """Two simulated workers; `move(model, rank, step)` is the inner step. Per worker, per
    round: the error and global parameters before and after it, and the local ones."""

    def worker(t):
        net = model()
        rep = fs.Replica(net, t, SparseLoCo(**settings), build_compressor({"name": "none"}),
                         total_steps=steps)
        seen = []
        for step in range(steps):
            move(net, t.rank, step)
            rep.sync_gradients()
            before = {k: v.clone() for k, v in rep.state.items()}
            local = flat(net)
            rep.sync_parameters()
            if not torch.equal(local, flat(net)):  # a round happened
                seen.append({"error": before["error"], "global": before["global"],
                             "local": local, "new_error": rep.state["error"].clone(),
                             "new_global": rep.state["global"].clone(), "params": flat(net)})
        return seen

    return simulate(2, worker)


def reference_sent(target: torch.Tensor, sizes: list[int], chunk: int, density: float,
                   bits: int) -> torch.Tensor:
    """Chunked top-k then quantization, one chunk at a time in plain torch."""
    out, start = torch.zeros_like(target), 0
    for n in sizes:
        for a in range(start, start + n, chunk):
            piece = target[a:min(a + chunk, start + n)]
            k = min(len(piece), max(1, math.ceil(density * len(piece))))
            top = piece.abs().argsort(descending=True)[:k]
            if bits == 32:
                out[a + top] = piece[top].float().double()
                continue
            scale = piece[top].abs().max().float().double()  # float32 on the wire
            levels = 2 ** bits - 1
            q = ((piece[top] / scale + 1) * (levels / 2)).round().clamp(0, levels)
            out[a + top] = scale * ((2 * q - levels) / levels)
        start += n
    return out


@pytest.mark.parametrize("settings", [
    {"period": 3, "chunk": 5, "density": 0.4, "outer_lr": 0.7},  # short last chunks
    {},  # the defaults: every tensor is smaller than a chunk; one round, after the last step
    {"period": 2, "chunk": 4, "density": 0.5, "bits": 4, "beta": 0.5},
    {"period": 3, "chunk": 3, "density": 1.0, "bits": 32},
])
def test_error_feedback_and_outer_step_match_plain_torch(settings):
    """7 steps of plain SGD inside; at each round, on each worker, e_new = beta e + D - sent
    and the global parameters become global - outer_lr (sent_0 + sent_1) / 2, bit for bit."""
    options = {"chunk": 4096, "density": 1 / 64, "bits": 2, "beta": 0.95, "outer_lr": 1.0,
               **settings}

    def move(model, rank, step):
        inner_step(model, move.optimizers.setdefault(
            (id(model), rank), torch.optim.SGD(model.parameters(), lr=0.1)), rank, step)
    move.optimizers = {}

    seen = rounds(7, move, **settings)
    assert len(seen[0]) == len(seen[1]) == (1 if not settings else 7 // options["period"] + 1)
    for a, b in zip(*seen):
        sent = []
        for r in (a, b):
            target = options["beta"] * r["error"] + (r["global"] - r["local"])
            sent.append(reference_sent(target, [12, 4, 8, 2], options["chunk"],
                                       options["density"], options["bits"]))
            assert torch.equal(r["new_error"], target - sent[-1])
        mean = (sent[0] + sent[1]) / 2
        for r in (a, b):
            assert torch.equal(r["new_global"], r["global"] - options["outer_lr"] * mean)
            assert torch.equal(r["params"], r["new_global"])  # every worker restarts there
        if options["density"] < 1:  # each keeps its own indices: gathered, not summed
            assert not torch.equal(sent[0] != 0, sent[1] != 0)


def test_error_feedback_keeps_exactly_what_was_not_sent():
    """Toy tensors whose kept values are within a factor 6 of their chunk's largest, where
    each subtraction is exact (Sterbenz): over three rounds sent + e_new == beta e + D
    exactly, sent holds 2 of each chunk of 4 (and of the short last 3), each value one of
    the levels +-scale, +-scale/3, and e_new is what was not sent."""

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.linspace(-1, 1, 8, dtype=torch.float64))
            self.b = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))

    def move(model, rank, step):
        gen = torch.Generator().manual_seed(10 * step + rank)
        with torch.no_grad():
            for p in model.parameters():
                sign = torch.randint(0, 2, p.shape, generator=gen) * 2 - 1
                p -= sign * (1 + torch.rand(p.shape, generator=gen, dtype=torch.float64))

    seen = rounds(3, move, model=Toy, period=1, chunk=4, density=0.5, beta=0.5)
    assert len(seen[0]) == 3
    for r in seen[0] + seen[1]:
        target = 0.5 * r["error"] + (r["global"] - r["local"])
        sent = reference_sent(target, [8, 3], 4, 0.5, 2)
        for a, b in [(0, 4), (4, 8), (8, 11)]:
            kept = sent[a:b] != 0
            assert int(kept.sum()) == 2
            largest = target[a:b].abs().max()
            assert bool((target[a:b][kept].abs() >= largest / 6).all())  # the toy's premise
            scale = largest.float().double()
            assert all(float(v.abs()) in (scale, scale * (1 / 3)) for v in sent[a:b][kept])
        assert torch.equal(r["new_error"], target - sent)
        assert torch.equal(sent + r["new_error"], target)
        assert torch.equal(r["new_error"][sent != 0] == 0, sent[sent != 0] == target[sent != 0])
    assert bool(seen[0][1]["error"].abs().sum() > 0)  # e carried something into round 2


def payload_bytes(sizes: list[int], chunk: int = 4096, density: float = 1 / 64,
                  bits: int = 2) -> int:
    """What one worker's buffer holds: a header of 8-byte words (4 fields), 12-bit offsets,
    `bits`-bit codes in whole bytes per bit plane, one float32 scale per chunk."""
    ks = [min(n - a, max(1, math.ceil(density * min(chunk, n - a))))
          for n in sizes for a in range(0, n, chunk)]
    count, planes = sum(ks), -(-sum(ks) // 8)
    values = 4 * count if bits == 32 else bits * planes + 4 * len(ks)
    return 8 * (1 + 2 * 4) + 12 * planes + values


MLP = [64 * 256, 256, 256 * 256, 256, 256 * 10, 10]  # the mlp on the 8x8 digits


@pytest.mark.parametrize("bits", [2, 32])
def test_sends_the_payload_it_counts_and_100x_fewer_bytes_than_allreduce(bits, synthetic,
                                                                         tmp_path):
    """30 steps at period 15: two rounds, after steps 14 and 29; each worker sends its
    buffer once a round (2 workers: the all-gather sends it to the other)."""
    run = sim_job(synthetic, tmp_path / "s", {"name": PATH, "bits": bits}, steps=30,
                  model="mlp").simulate(2)
    assert run.summary["bytes_sent_total"] == 2 * 2 * payload_bytes(MLP, bits=bits)
    sent = {m["step"] for m in run.metrics() if m["bytes_sent"] > 0}
    assert sent == {15, 30}  # (metrics number the steps from 1)
    dense = sim_job(synthetic, tmp_path / "a", {"name": "allreduce"}, steps=30,
                    model="mlp").simulate(2)
    assert dense.summary["bytes_sent_total"] >= 100 * run.summary["bytes_sent_total"]
    assert run.summary["consensus_distance"] == 0


def test_buffers_take_the_plain_mean_with_no_error_feedback():
    """A BatchNorm's running statistics: each worker's own differ; after the round every
    worker holds their mean, and the accumulator holds nothing for them."""

    def worker(t):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        rep = fs.Replica(model, t, SparseLoCo(), total_steps=1, optimizer=optimizer)
        x = torch.randn(8, 3, generator=torch.Generator().manual_seed(t.rank)) + 10 * t.rank
        model(x).square().mean().backward()
        rep.sync_gradients()
        optimizer.step()
        own = model[1].running_mean.clone()
        rep.sync_parameters()
        return own, model[1].running_mean.clone(), rep.state["error"]

    out = simulate(2, worker)
    assert not torch.equal(out[0][0], out[1][0])
    for _, mean, error in out:
        assert torch.allclose(mean, (out[0][0] + out[1][0]) / 2, atol=1e-6)
        assert torch.equal(error[-6:], torch.zeros(6))  # running mean and variance, last
        assert bool(error[:-6].abs().sum() > 0)


@pytest.mark.parametrize("settings, message", [
    ({"density": 0.0}, r"strategy.density must be in \(0, 1\]"),
    ({"density": 1.5}, r"strategy.density must be in \(0, 1\]"),
    ({"chunk": 0}, "strategy.chunk must be >= 1"),
    ({"bits": 3}, "strategy.bits must be one of 2, 4, 8, 32"),
    ({"beta": 1.5}, r"strategy.beta must be in \[0, 1\]"),
    ({"period": 0}, "strategy.period must be >= 1"),
    ({"outer_lr": 0.0}, "strategy.outer_lr must be > 0"),
])
def test_bad_input_is_one_line_naming_the_key(settings, message, synthetic, tmp_path):
    refused_in_one_line(
        lambda: sim_job(synthetic, tmp_path, {"name": PATH, **settings}, steps=4).simulate(2),
        message)


def test_a_codec_is_refused(synthetic, tmp_path):
    job = sim_job(synthetic, tmp_path, {"name": PATH}, **{"compression.name": "topk"})
    refused_in_one_line(lambda: job.simulate(2), "compression.name = 'topk'.*sparseloco")


def test_survivors_carry_on_without_a_lost_worker(synthetic, tmp_path):
    """Worker 2 of 4 is lost at step 12: the others average what they gathered and end
    identical (the same run without the crash: 0.44)."""
    job = sim_job(synthetic, tmp_path, {"name": PATH, "period": 5}, steps=60,
                  **{"faults.crash": [{"worker": 2, "step": 12}], "faults.detect": "50ms"})
    result = job.simulate(4)
    assert [w["worker"] for w in result.summary["lost_workers"]] == [2]
    assert result.summary["consensus_distance"] < 1e-10
    assert result.accuracy > 0.3  # chance: 0.1


@pytest.mark.multiproc
def test_real_processes_shrink_around_a_worker_killed_in_its_exchange(tmp_path):
    """3 processes, period 5: worker 2 is killed (-9) just before the round of step 10; the
    other two do that round again between them and finish, identical."""
    sets = {"strategy.name": PATH, "strategy.period": 5, "data.name": "digits",
            "model.name": "mlp", "run.workers": 3, "run.steps": 20, "run.eval_every": 0,
            "run.out": str(tmp_path)}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTSGD_TEST_KILL": "2:10:parameters"}
    done = subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", "--no-report",
                           *args], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [lost["worker"] for lost in summary["lost_workers"]] == [2]
    assert summary["steps"] == 20 and summary["consensus_distance"] == 0
