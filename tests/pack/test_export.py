"""The step and the model as graphs: the same gradients as eager PyTorch, and one line saying
what cannot be captured, and where."""

import io
import os
import subprocess
import sys
import zipfile

import pytest
import torch
import torch.nn.functional as F

from fastsgd.errors import UserError
from fastsgd.loop.plan import cross_entropy_step
from fastsgd.pack.export import export_programs
from fastsgd.workloads.models import build_model


def _load(data: bytes) -> torch.nn.Module:
    return torch.export.load(io.BytesIO(data)).module()


@pytest.mark.parametrize("name,shape", [("mlp", (1, 8, 8)), ("lenet", (1, 8, 8)),
                                        ("resnet20", (3, 8, 8))])
def test_the_loss_graph_gives_eager_gradients_and_buffers_bitwise(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    x, y = torch.randn(6, *shape), torch.randint(0, 10, (6,))
    loss_graph, _ = export_programs(model, cross_entropy_step, x, y)
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]
    for batch in (6, 1, 11):  # any batch size
        x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
        loss, *updated = _load(loss_graph)(params, buffers, x, y)
        grads = torch.autograd.grad(loss, params)
        model.zero_grad()
        eager = cross_entropy_step(model, (x, y))
        eager.backward()
        assert torch.equal(loss, eager)
        assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
        # BatchNorm's running statistics: updated as the eager model updated its own
        assert all(torch.equal(u, b) for u, b in zip(updated, model.buffers()))
        buffers = [u.detach() for u in updated]


def test_the_forward_graph_is_the_model_in_eval_mode():
    torch.manual_seed(0)
    model = build_model("resnet20", (3, 8, 8), 10)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    _, forward_graph = export_programs(model, cross_entropy_step, x, y)
    assert model.training  # left as it was
    out = _load(forward_graph)([p.detach() for p in model.parameters()],
                               list(model.buffers()), x)
    assert torch.equal(out, model.eval()(x))


def _branchy(model, batch):
    x, y = batch
    out = model(x)
    if out.sum() > 0:
        return F.cross_entropy(out, y)
    return out.mean()


def _per_sample(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


def _numpy(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1]) * float(batch[0].numpy().mean())


OUTSIDE = torch.ones(10)


def _captures(model, batch):
    return F.cross_entropy(model(batch[0]) * OUTSIDE, batch[1])


@pytest.mark.parametrize("step,says", [
    (_branchy, ["model.step cannot be exported", "data-dependent control flow",
                "test_export.py", "in _branchy: if out.sum() > 0:"]),
    (_numpy, ["model.step cannot be exported", ".numpy()", "in _numpy:"]),
    (_per_sample, ["must return the batch's loss as a floating-point scalar",
                   "float32 tensor of shape (batch)"]),
    (lambda model, batch: model(batch[0]), ["float32 tensor of shape (batch, 10)"]),
    (_captures, ["neither the model's parameters or buffers nor the batch"]),
])
def test_a_step_that_cannot_be_exported_says_why_and_where(step, says):
    model = build_model("mlp", (1, 8, 8), 10)
    with pytest.raises(UserError) as e:
        export_programs(model, step, torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,)))
    message = str(e.value)
    assert "\n" not in message
    for text in says:
        assert text in message, message


def test_a_saved_graph_holds_no_stack_trace_and_no_example_inputs():
    model = build_model("lenet", (1, 8, 8), 10)
    loss_graph, forward_graph = export_programs(model, cross_entropy_step,
                                                torch.randn(4, 1, 8, 8),
                                                torch.randint(0, 10, (4,)))
    for data in (loss_graph, forward_graph):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            text = b"".join(z.read(n) for n in z.namelist())
            pickled = [i for i in z.infolist() if i.filename.endswith(".pt") and i.file_size]
        assert not pickled
        for leak in (b"stack_trace", b"test_export", b"nn_module_stack", b"LeNet5",
                     b"fastsgd", b".py"):
            assert leak not in text, leak



def test_a_model_that_fails_on_the_batch_prints_nothing_but_the_error(tmp_path):
    """torch.export logs the failing operation at ERROR level, through handlers that write
    to the stderr of the process (about 90 lines) above fastsgd's one line."""
    (tmp_path / "badmodel.py").write_text(
        "import torch.nn as nn\n\n\ndef make():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(100, 10))\n")
    (tmp_path / "job.toml").write_text('[model]\nname = "badmodel:make"\n[data]\nname = "digits"\n')
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "fastsgd", "pack", "job.toml"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.startswith("fastsgd: error: model.step cannot be exported")
    assert done.stderr.count("\n") == 1, done.stderr
