"""DeMo: the DCT and its chunks, what the momentum keeps, plain SGD when every component is
sent, identical replicas, honest bytes, bad input, codecs, checkpoints, the conformance
suite, a lost worker and a short GPT run."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import fastsgd as fs
from fastsgd.strategies.lowcomm.demo import DeMo, as_matrix, chunk_size, dct_matrix, decode, encode
from fastsgd.transport.sim import simulate
from tests.strategies.helpers import assert_resumes_bitwise, refused_in_one_line, sim_job

PATH = "demo"
LR, DECAY = 0.1, 0.01


def tiny_model() -> torch.nn.Module:
    """Parameter tensors of 6 x 4, 6, 3 x 6 and 3 elements, in float64."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, 3)).double()


def backward(model: torch.nn.Module, rank: int, step: int) -> None:
    gen = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    model.zero_grad()
    ((model(x) - y) ** 2).mean().backward()


def train(workers: int, steps: int, **settings) -> list[dict]:
    """Each simulated worker's parameters, momentum and last momenta before and after a
    step (and the gradient DeMo left), its SGD built with momentum, which DeMo zeroes."""

    def worker(t):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, nesterov=True,
                                    weight_decay=DECAY)
        replica = fs.Replica(model, t, DeMo(**settings), total_steps=steps, optimizer=optimizer)
        demo = replica.strategy
        for step in range(steps):
            backward(model, t.rank, step)
            before = replica.state["momentum"] * demo.beta + torch.cat(
                [p.grad.reshape(-1) for p in model.parameters()])
            replica.sync_gradients()
            grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            optimizer.step()
            replica.sync_parameters()
        return {"params": [p.detach().clone() for p in model.parameters()],
                "before": before, "after": replica.state["momentum"].clone(), "grad": grad,
                "momentum": [g["momentum"] for g in optimizer.param_groups], "demo": demo}

    return simulate(workers, worker)


def test_dct_matrix_is_the_orthonormal_dct_ii():
    n = 5
    d = dct_matrix(n)
    for k in range(n):
        scale = math.sqrt((1 if k == 0 else 2) / n)
        row = [scale * math.cos(math.pi * (2 * i + 1) * k / (2 * n)) for i in range(n)]
        assert torch.allclose(d[k], torch.tensor(row, dtype=torch.float64), atol=1e-15)
    assert torch.allclose(d @ d.T, torch.eye(n, dtype=torch.float64), atol=1e-14)
    assert dct_matrix(8, torch.float32) is dct_matrix(8, torch.float32)  # cached


@pytest.mark.parametrize("shape, chunk", [((6, 10), 4), ((256,), 64), ((10, 256), 64),
                                          ((97, 12), 8), ((4, 3, 3, 3), 4), ((), 64)])
def test_round_trip_is_exact_and_chunks_are_2d_dcts(shape, chunk):
    gen = torch.Generator().manual_seed(1)
    rows, cols = as_matrix(torch.Size(shape))
    h, w = chunk_size(rows, chunk), chunk_size(cols, chunk)
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        x = torch.randn(rows, cols, generator=gen, dtype=dtype)
        c = encode(x, h, w)
        assert c.shape == (rows * cols // (h * w), h * w)
        assert (decode(c, rows, cols, h, w) - x).abs().max() <= tolerance
    # chunk j (row-major) is D_h X_j D_w^T, written as the Kronecker product on vec(X_j)
    kron = torch.kron(dct_matrix(h), dct_matrix(w))
    blocks = [x[a:a + h, b:b + w].double() for a in range(0, rows, h) for b in range(0, cols, w)]
    want = torch.stack([kron @ block.reshape(-1) for block in blocks])
    assert torch.allclose(c.double(), want, atol=1e-5)


def test_each_dimension_is_cut_in_its_largest_divisor_up_to_the_chunk():
    assert [chunk_size(n, 64) for n in (256, 64, 10, 100, 97, 1)] == [64, 64, 10, 50, 1, 1]
    assert as_matrix((256,)) == (1, 256) and as_matrix((8, 3, 5, 5)) == (8, 75)
    assert as_matrix(()) == (1, 1)


@pytest.mark.parametrize("beta", [0.999, 0.5])
def test_every_component_kept_without_sign_is_plain_sgd_on_the_mean_gradient(beta):
    """With topk >= h w, q = m: the momentum is emptied every step, so beta drops out, and
    Q = the mean of the workers' gradients. DeMo is then torch.optim.SGD(momentum=0) on the
    averaged gradient (its weight decay included), whatever momentum the user's SGD had."""
    workers, steps = 3, 6
    got = train(workers, steps, beta=beta, topk=64, chunk=8, sign=False)
    models = [tiny_model() for _ in range(workers)]
    reference = models[0]
    sgd = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.0, weight_decay=DECAY)
    for step in range(steps):
        for rank, model in enumerate(models):
            model.load_state_dict(reference.state_dict())
            backward(model, rank, step)
        for i, p in enumerate(reference.parameters()):
            p.grad = sum(list(m.parameters())[i].grad for m in models) / workers
        sgd.step()
    for out in got:
        assert max(float((a - b.detach()).abs().max())
                   for a, b in zip(out["params"], reference.parameters())) < 1e-10
        assert float(out["after"].abs().max()) < 1e-12  # nothing kept back
        assert out["momentum"] == [0.0]  # DeMo's momentum replaced the optimizer's
    few = train(workers, steps, beta=beta, topk=2, chunk=8, sign=False)[0]["params"]
    assert max(float((a - b.detach()).abs().max())
               for a, b in zip(few, reference.parameters())) > 1e-3


def test_the_momentum_keeps_exactly_what_was_not_sent_and_q_is_the_mean():
    """After a step, in the DCT domain, the momentum is zero at the topk coefficients of
    each chunk and unchanged elsewhere; the gradient left is sign(mean of the workers' q)."""
    got = train(3, 4, topk=3, chunk=4)
    demo = got[0]["demo"]
    sent = []
    for out in got:
        for t in demo._tensors:
            before = encode(out["before"][t.start:t.end].view(t.rows, t.cols), t.h, t.w)
            after = encode(out["after"][t.start:t.end].view(t.rows, t.cols), t.h, t.w)
            kept = torch.zeros_like(before, dtype=torch.bool)
            kept.scatter_(1, before.abs().topk(t.k, dim=1).indices, True)
            assert t.k == min(3, t.h * t.w) and int(kept.sum()) == t.chunks * t.k
            assert after[kept].abs().max() < 1e-12
            assert torch.allclose(after[~kept], before[~kept], atol=1e-12)
        sent.append(out["before"] - out["after"])  # q
    mean = sum(sent) / 3
    clear = mean.abs() > 1e-9
    assert torch.equal(got[0]["grad"][clear], mean.sign()[clear])
    assert not torch.equal(got[0]["after"], got[1]["after"])  # each worker keeps its own


def test_replicas_stay_identical():
    got = train(3, 10, topk=2, chunk=2)
    for out in got[1:]:
        assert all(torch.equal(a, b) for a, b in zip(out["params"], got[0]["params"]))
    assert got[0]["grad"].abs().max() == 1  # the signum


def test_bytes_are_the_kept_values_and_their_int16_indices(tmp_path):
    """MLP on digits: per worker and step, the chunks' kept coefficients (chunks x
    min(topk, h w) per tensor) as float32 values and int16 indices, gathered by a ring."""
    result = sim_job("digits", tmp_path, {"name": PATH}, steps=4).simulate(2)
    kept = 0
    for p in torch.load(result.run_dir / "model.pt", weights_only=True).values():
        rows, cols = as_matrix(p.shape)
        h, w = chunk_size(rows, 64), chunk_size(cols, 64)
        kept += rows * cols // (h * w) * min(32, h * w)
    assert kept == 1034
    sent = {m["bytes_sent"] for m in result.metrics()}
    assert sent == {kept * (4 + 2)}  # (n - 1) = 1 peer's worth in a ring all-gather
    assert result.summary["consensus_distance"] == 0


@pytest.mark.parametrize("settings, message", [
    ({"chunk": 0}, "strategy.chunk must be a power of two"),
    ({"chunk": 48}, "strategy.chunk must be a power of two"),
    ({"chunk": -4}, "strategy.chunk must be a power of two"),
    ({"topk": 0}, "strategy.topk must be >= 1"),
    ({"beta": 1.0}, r"strategy.beta must be in \[0, 1\)"),
    ({"beta": -0.1}, r"strategy.beta must be in \[0, 1\)"),
])
def test_bad_input_is_one_line_naming_the_key(settings, message, synthetic, tmp_path):
    refused_in_one_line(
        lambda: sim_job(synthetic, tmp_path, {"name": PATH, **settings}, steps=4).simulate(2),
        message)


@pytest.mark.parametrize("options, message", [
    ({"optimizer.name": "adam"}, "strategy.name = 'demo' applies sign.*optimizer.name = 'sgd'"),
    ({"compression.name": "topk"}, "compression.name = 'topk'.*takes exact codecs"),
    # it would clip sign(Q), the update DeMo leaves in p.grad, not a gradient
    ({"optimizer.clip_norm": 1.0}, r"^optimizer.clip_norm = 1.0 .*strategy.name = 'demo'"),
])
def test_other_optimizers_and_codecs_are_refused(options, message, synthetic, tmp_path):
    refused_in_one_line(
        lambda: sim_job(synthetic, tmp_path, {"name": PATH}, steps=4, **options).simulate(2),
        message)


def test_state_is_saved_and_restored():
    def replica(t):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        return model, optimizer, fs.Replica(model, t, DeMo(topk=3, chunk=4), total_steps=12,
                                           optimizer=optimizer)

    def steps(t, model, optimizer, rep, first, last):
        for step in range(first, last):
            backward(model, t.rank, step)
            rep.sync_gradients()
            optimizer.step()
            rep.sync_parameters()

    assert_resumes_bitwise(2, replica, steps)


def test_survivors_of_a_lost_worker_go_on_identical(tmp_path):
    options = {"faults.crash": [{"worker": 3, "step": 10}], "faults.detect": "50ms",
               "optimizer.lr": 0.01}
    result = sim_job("digits", tmp_path, {"name": PATH}, steps=30, **options).simulate(4)
    assert [w["worker"] for w in result.summary["lost_workers"]] == [3]
    assert result.summary["consensus_distance"] == 0
    assert result.accuracy > 0.5  # chance: 0.1


@pytest.mark.multiproc
@pytest.mark.parametrize("kill", ["1:10:gradients", "2:12"])
def test_real_survivors_shrink_and_end_identical(kill, tmp_path):
    """A worker killed (-9) with its coefficients in flight or between steps: the two left
    redo the step among themselves, each momentum moved once, and end alike."""
    sets = {"data.name": "digits", "model.name": "mlp", "run.workers": 3, "run.steps": 24,
            "run.eval_every": 0, "strategy.name": PATH, "optimizer.lr": 0.01,
            "run.out": str(tmp_path)}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTSGD_TEST_KILL": kill}
    done = subprocess.run([sys.executable, "-m", "fastsgd", "run", "--quiet", "--no-report",
                           *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [lost["worker"] for lost in summary["lost_workers"]] == [int(kill[0])]
    assert summary["steps"] == 24 and summary["consensus_distance"] == 0
