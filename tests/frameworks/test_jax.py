"""JAX workers: the user's pure loss on fastsgd's strategies. The same MLP in JAX and in
PyTorch reaches the same accuracy; gradients and parameters cross without copies; bad
input is one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'fastsgd[jax]')")
optax = pytest.importorskip("optax", reason="optax is not installed (pip install 'fastsgd[jax]')")

import jax.numpy as jnp  # noqa: E402

import fastsgd as fs  # noqa: E402
from fastsgd.cli.main import main  # noqa: E402
from fastsgd.errors import UserError  # noqa: E402
from fastsgd.frameworks import jax as fj  # noqa: E402
from fastsgd.workloads.models import build_model  # noqa: E402

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "jax_vs_torch.py"
sys.path.insert(0, str(ROOT / "examples"))
import jax_mlp  # noqa: E402


def _torch_mlp(seed=0, shape=(1, 8, 8)):
    torch.manual_seed(seed)
    model = build_model("mlp", shape, 10)
    params = [{"w": m.weight.detach().T.contiguous().numpy(), "b": m.bias.detach().numpy()}
              for m in model if isinstance(m, torch.nn.Linear)]
    return model, params


def test_the_jax_loss_gives_torch_s_gradients():
    model, params = _torch_mlp()
    module = fj.Model(params, jax_mlp.apply, jax_mlp.loss)()
    assert [n for n, _ in module.named_parameters()] == [  # pytree paths (sorted dict keys)
        "0.b", "0.w", "1.b", "1.w", "2.b", "2.w"]
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    loss = module.loss(x, y)
    loss.backward()
    expected = F.cross_entropy(model(x), y)
    expected.backward()
    assert torch.allclose(loss, expected, atol=1e-6)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    grads = [g for m in linears for g in (m.bias.grad, m.weight.grad.T)]
    for mine, theirs in zip((p.grad for p in module.parameters()), grads):
        assert torch.allclose(mine, theirs, atol=1e-6)
    assert torch.allclose(module(x), model(x), atol=1e-5)  # evaluation: apply


def test_a_pytree_of_mixed_depth_keeps_each_leaf_in_its_place():
    params = {"a": {"w": jnp.ones((2, 3))}, "b": jnp.full((3,), 2.0)}  # torch lists b first

    def loss(p, batch):
        return (batch[0].reshape(len(batch[0]), -1)[:, :2] @ p["a"]["w"] * p["b"]).sum()

    module = fj.Model(params, lambda p, x: x, loss)()
    assert module.get_parameter("a.w").shape == (2, 3)
    x = torch.ones(4, 1, 1, 2)
    module.loss(x, torch.zeros(4, dtype=torch.long)).backward()
    assert torch.equal(module.get_parameter("a.w").grad, torch.full((2, 3), 8.0))
    assert torch.equal(module.get_parameter("b").grad, torch.full((3,), 8.0))


def test_ddp_is_refused_for_a_jax_model():
    _, params = _torch_mlp()
    with pytest.raises(UserError, match="strategy.name = 'ddp' wraps the model"):
        job = fs.Job(model=fj.Model(params, jax_mlp.apply, jax_mlp.loss), data="digits",
                     strategy="ddp")
        job.plan(job.config)  # what run() does first, once JAX may be forked


def test_parameters_reach_jax_without_a_copy():
    _, params = _torch_mlp()
    module = fj.Model(params, jax_mlp.apply, jax_mlp.loss)()
    for p in module.parameters():
        assert fj._to_jax(p).unsafe_buffer_pointer() == p.data_ptr()


def test_init_runs_in_each_worker_from_the_run_s_seed():
    model = fj.Model(jax_mlp.init, jax_mlp.apply)
    torch.manual_seed(3)
    a = model()
    torch.manual_seed(3)
    b = model()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_an_optax_optimizer_steps_as_torch_sgd_does():
    _, params = _torch_mlp()
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    runs = []
    for make in (fj.optax_optimizer(optax.sgd(0.1, momentum=0.9)),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)):
        module = fj.Model(params, jax_mlp.apply, jax_mlp.loss)()
        optimizer = make(module.parameters())
        for _ in range(3):
            optimizer.zero_grad()
            module.loss(x, y).backward()
            optimizer.step()
        runs.append((module, optimizer))
    for p, q in zip(runs[0][0].parameters(), runs[1][0].parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    module, optimizer = runs[0]
    state = optimizer.state_dict()
    assert all(isinstance(t, torch.Tensor) for t in state["optax"])  # checkpoints as tensors
    again = fj.optax_optimizer(optax.sgd(0.1, momentum=0.9))(module.parameters())
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict()["optax"], state["optax"]))


def _vector_loss(params, batch):
    return jax_mlp.apply(params, batch[0]).sum(axis=1)


@pytest.mark.parametrize("params,loss,says", [
    ("good", _vector_loss, "the JAX loss must return the batch's loss as a floating-point "
                           "scalar; it returned shape (32,)"),
    ([{"w": "weights"}], None, "parameter '0.w' is str"),
    ({"w": np.zeros((2, 2), np.int32)}, None, "parameter 'w' is an array of int32"),
    ([], None, "parameters are empty"),
])
def test_bad_jax_input_is_one_line(params, loss, says, tmp_path, monkeypatch, capsys):
    _, good = _torch_mlp()
    module = tmp_path / "bad_jax_model.py"
    module.write_text("")
    import types

    fake = types.ModuleType("bad_jax_model")
    fake.model = fj.Model(good if params == "good" else params, jax_mlp.apply, loss)
    monkeypatch.setitem(sys.modules, "bad_jax_model", fake)
    config = tmp_path / "job.toml"
    config.write_text('[model]\nname = "bad_jax_model:model"\n[data]\nname = "digits"\n')
    assert main(["simulate", str(config), "--set", f"run.out={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_a_jax_model_from_a_config_records_its_own_step(tmp_path, monkeypatch):
    import types

    _, params = _torch_mlp()
    fake = types.ModuleType("good_jax_model")
    fake.model = fj.Model(params, jax_mlp.apply, jax_mlp.loss)
    monkeypatch.setitem(sys.modules, "good_jax_model", fake)
    job = fs.Job(options={"model.name": "good_jax_model:model", "data.name": "digits",
                          "run.workers": 2, "run.steps": 5, "run.out": str(tmp_path)},
                 quiet=True)
    assert job.config["model"]["step"] == "model_loss"
    result = job.simulate()
    assert result.accuracy > 0.1
    assert 'step = "model_loss"' in (result.run_dir / "config.toml").read_text()


def test_forked_workers_are_refused_once_jax_ran_here(tmp_path):
    _, params = _torch_mlp()
    jnp.ones(3).block_until_ready()  # JAX's runtime is now started in this process
    job = fs.Job(model=fj.Model(params, jax_mlp.apply, jax_mlp.loss), data="digits",
                 options={"run.workers": 2, "run.steps": 5, "run.out": str(tmp_path)})
    with pytest.raises(UserError, match="ran JAX before starting its workers"):
        job.run()


# Every family, each with a codec where it carries one: the JAX model is only a source of
# gradients and a holder of parameters, so whatever the strategy does to them applies.
@pytest.mark.parametrize("strategy,codec", [
    ("allreduce", "topk"), ("ssp", "none"), ("localsgd", "qsgd"), ("easgd", "none"),
    ("bmuf", "none"), ("diloco", "none"), ("dpsgd", "onebit"), ("adpsgd", "none"),
    ("sgp", "fp16"), ("ps", "none"), ("hogwild", "none"), ("ltfb", "none")])
def test_every_strategy_trains_a_jax_model(strategy, codec, tmp_path):
    _, params = _torch_mlp()
    job = fs.Job(model=fj.Model(params, jax_mlp.apply, jax_mlp.loss), data="digits",
                 strategy=strategy, compressor=codec, quiet=True,
                 options={"run.workers": 4, "run.steps": 150, "run.out": str(tmp_path),
                          "compute.model": "fixed", "compute.step_time": "5ms"})
    assert job.simulate().accuracy > 0.8


def _script(framework, mode, steps, out, strategies, *options):
    """tests/scripts/jax_vs_torch.py in a process of its own (2 workers): {strategy: accuracy}
    ({framework: {strategy: accuracy}} for FRAMEWORK torch,jax)."""
    return subprocess.Popen([sys.executable, str(SCRIPT), framework, mode, str(steps), "2",
                             str(out), *strategies, *options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def _accuracies(mode, out, strategies):
    """{framework: {strategy: accuracy}} of the MLP in PyTorch and in JAX (2 workers, 600
    steps on Fashion-MNIST, the rate on a cosine schedule to 0). Simulated: each framework
    in a process of its own, side by side; real: one after the other (PyTorch's first, then
    JAX's, whose parent process never runs JAX), in one process that starts up once."""
    if mode == "run":
        return _printed(_script("torch,jax", mode, 600, out, strategies, "--schedule=cosine"))
    procs = {f: _script(f, mode, 600, out / f, strategies, "--schedule=cosine")
             for f in ("torch", "jax")}
    return {f: _printed(p) for f, p in procs.items()}


def _printed(proc):
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.splitlines()[-1])


# Measured (2-core Xeon, 2026-12-08), 600 steps with the rate on a cosine schedule to 0:
# simulated, PyTorch allreduce 84.91% and sgp 84.67%, JAX minus PyTorch -0.08 and +0.05
# points (1500 steps at a constant rate, 2026-11-28: allreduce +0.28, dpsgd +0.49, sgp
# +0.20, about 85.5%; a constant rate's last evaluations are noisy, a point apart from one
# to the next). Real sgp depends on timing (what each push mixes), so two real runs are two
# draws: 10 runs of each under a load average of 3 to 8, PyTorch 84.2-84.9%, JAX 84.5-84.9%
# (1500 steps at a constant rate, 2026-12-07: PyTorch 85.1-86.1%, JAX 85.2-86.0%, and a CI
# run once drew 84.8% against 86.2%). So real runs are compared within 2 points, the
# simulated (deterministic) within 1, and each must train: a JAX path that breaks the
# asynchronous updates ends far below the floor, and one that misses the schedule (a
# constant rate: 82.7% at step 600) is over a point from PyTorch.
TOLERANCE = {"simulate": 0.01, "run": 0.02}


@pytest.mark.parametrize("mode", ["simulate", pytest.param("run", marks=pytest.mark.multiproc)])
def test_the_same_mlp_in_jax_and_pytorch_reaches_the_same_accuracy(mode, tmp_path):
    # real: one at a time, and sgp alone, whose real runs depend on timing (the
    # deterministic strategies train the simulated model: the next test). No dpsgd: on two
    # workers its ring averages both models every step, allreduce's arithmetic in another
    # order (gossip on JAX workers: the next test)
    strategies = ["allreduce", "sgp"] if mode == "simulate" else ["sgp"]
    found = _accuracies(mode, tmp_path, strategies)
    for strategy, accuracy in found["torch"].items():
        assert min(accuracy, found["jax"][strategy]) > 0.83, found
        assert abs(found["jax"][strategy] - accuracy) <= TOLERANCE[mode], found


@pytest.mark.multiproc
def test_jax_workers_on_real_processes_train_the_simulated_model_bitwise(tmp_path):
    """allreduce and dpsgd, 100 steps: the real run's parameters are the simulated run's
    (whose accuracy the test above compares with PyTorch's), bit for bit."""
    strategies = ["allreduce", "dpsgd"]
    procs = [_script("jax", mode, 100, tmp_path / mode, strategies)
             for mode in ("run", "simulate")]  # side by side: the bits do not depend on time
    assert _printed(procs[0]) == _printed(procs[1])  # the same accuracies, of course
    for strategy in strategies:
        real, simulated = (torch.load(tmp_path / m / strategy / "model.pt", weights_only=True)
                           for m in ("run", "simulate"))
        assert real.keys() == simulated.keys()
        assert all(torch.equal(real[k], simulated[k]) for k in real), strategy
