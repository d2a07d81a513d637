"""Mistakes in the Python API's arguments (the user's step, evaluate, model, optimizer,
strategy, compressor, config, options) end in one line of ours that names the culprit and
says what is expected, not in a traceback deep inside fastsgd or a silently wrong run."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastsgd as fs
from fastsgd.errors import ConfigError, UserError
from fastsgd.loop.checked_step import StepChecks

SMALL = {"data.name": "synthetic", "model.name": "mlp", "run.workers": 2, "run.steps": 3}
# the workers' own loop: no profiling of the step, no compute lanes trying it first
IN_WORKERS = {"compute.model": "fixed", "compute.step_time": "1ms", "compute.lanes": 0}
MUST = "it must return the batch's loss as a scalar torch.Tensor that requires grad"


def _loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def _backward_itself(model, batch):
    loss = _loss(model, batch)
    loss.backward()
    return loss


def _backward_then_detach(model, batch):
    return _backward_itself(model, batch).detach()


def _under_no_grad(model, batch):
    with torch.no_grad():
        return _loss(model, batch)


_OTHER = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def _global_model(model, batch):
    return _loss(_OTHER, batch)


class _FrozenUse(nn.Module):
    """Its only trainable parameter is not in the forward."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(64, 10).requires_grad_(False)
        self.unused = nn.Linear(1, 1)

    def forward(self, x):
        return self.used(x.flatten(1))


class _HalfUsed(nn.Module):
    """One layer in the forward, one not: some parameters get no gradient, legitimately."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(64, 10)
        self.unused = nn.Linear(1, 1)

    def forward(self, x):
        return self.used(x.flatten(1))


def _simulate(tmp_path, **given):
    options = {**SMALL, **given.pop("options", {}), "run.out": str(tmp_path / "run")}
    return fs.Job(options=options, quiet=True, **given).simulate()


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("step, what", [
    (lambda model, batch: None, "None"),
    (lambda model, batch: 1.0, "a float"),
    (lambda model, batch: 3, "an int"),
    (lambda model, batch: (_loss(model, batch), 0.5), "a tuple"),
    (lambda model, batch: _loss(model, batch).item(), "a float"),
    (lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], reduction="none"),
     "a tensor of shape (32,) (reduce it, e.g. with .mean())"),
    (lambda model, batch: _loss(model, batch).detach(), "a tensor that does not require grad"),
    (_under_no_grad, "a tensor that does not require grad"),
])
def test_a_step_returning_no_loss_is_one_line_naming_the_worker(tmp_path, step, what):
    with pytest.raises(UserError) as err:
        _simulate(tmp_path, step=step, options=IN_WORKERS)
    message = _one_line(err)
    assert message.startswith(f"worker 0: model.step returned {what}") and MUST in message


def test_a_loss_from_frozen_parameters_only_is_one_line(tmp_path):
    with pytest.raises(UserError) as err:
        _simulate(tmp_path, model=_FrozenUse, options=IN_WORKERS)
    assert _one_line(err).startswith("worker 0: model.step returned a tensor that does not "
                                     "require grad")


def test_the_profiled_step_is_checked_as_the_workers_is(tmp_path):
    """compute.model = 'profile' (the default) runs the step before any worker does."""
    with pytest.raises(UserError) as err:
        _simulate(tmp_path, step=lambda model, batch: None)
    assert _one_line(err) == ("profiling (compute.model = 'profile'): model.step returned "
                              f"None; {MUST}")
    with pytest.raises(UserError, match=r"^profiling .*: model.step called backward\(\) "):
        _simulate(tmp_path, step=_backward_itself)
    with pytest.raises(UserError, match=r"^profiling .*: model.step's loss does not depend"):
        _simulate(tmp_path, step=_global_model)
    lanes = {**IN_WORKERS, "compute.lanes": 1}  # they try the step first (simulation.py)
    with pytest.raises(UserError, match=r"^model.step, tried before the simulation: model.step "
                                        r"returned None"):
        _simulate(tmp_path, step=lambda model, batch: None, options=lanes)


@pytest.mark.parametrize("step", [_backward_itself, _backward_then_detach])
def test_a_step_calling_backward_itself_is_one_line(tmp_path, step):
    with pytest.raises(UserError) as err:
        _simulate(tmp_path, step=step, options=IN_WORKERS)
    assert _one_line(err) == ("worker 0: model.step called backward() itself; return the "
                              "loss and fastsgd calls backward")


def test_a_step_training_another_model_fails_instead_of_succeeding(tmp_path):
    with pytest.raises(UserError) as err:
        _simulate(tmp_path, step=_global_model, options=IN_WORKERS)
    assert _one_line(err).startswith("worker 0: model.step's loss does not depend on the "
                                     "model it was given (no parameter got a gradient)")


def test_parameters_without_a_gradient_are_fine_while_some_get_one(tmp_path):
    result = _simulate(tmp_path, model=_HalfUsed, options=IN_WORKERS)
    assert result.summary["steps"] == 3


def test_the_walks_over_the_parameters_stop_after_the_first_backward():
    model = nn.Linear(4, 2)
    steps = []

    def step(m, batch):  # the second time, a loss that does not reach the model
        steps.append(1)
        return _loss(m if len(steps) == 1 else _OTHER[1], batch)

    checks = StepChecks(step, list(model.parameters()), "worker 3: ")
    batch = (torch.randn(8, 4), torch.randint(0, 2, (8,)))
    checks(model, batch).backward()
    checks.backward_done()
    assert not checks.first
    model.zero_grad()
    checks(model, (torch.randn(8, 64), torch.randint(0, 10, (8,)))).backward()
    checks.backward_done()  # not checked again: no cost after the first step
    with pytest.raises(UserError, match="^worker 3: model.step returned None"):
        StepChecks(lambda m, b: None, [], "worker 3: ")(model, batch)


@pytest.mark.multiproc
@pytest.mark.parametrize("step, message", [
    (lambda model, batch: None, f"model.step returned None; {MUST}"),
    (_global_model, "model.step's loss does not depend on the model it was given"),
])
def test_real_workers_check_the_step_too(tmp_path, step, message):
    job = fs.Job(step=step, options={**SMALL, "run.out": str(tmp_path / "run")}, quiet=True)
    with pytest.raises(UserError) as err:
        job.run()
    assert _one_line(err).startswith("worker ") and message in str(err.value)


@pytest.mark.parametrize("given, message", [
    ({"step": lambda model: _loss(model, None)},
     "the step argument tests.test_user_code:<lambda> does not take 2 arguments; it must be "
     "a function(model, batch) -> loss"),
    ({"evaluate": lambda model, dataset: (1.0, 0.0)},
     "the evaluate argument tests.test_user_code:<lambda> does not take 3 arguments; it must "
     "be a function(model, dataset, device) -> (accuracy, loss)"),
    ({"step": 5}, "step must be a name or a function(model, batch) -> loss; got an int"),
])
def test_a_step_or_evaluate_taking_other_arguments_is_refused_before_the_run(
        tmp_path, given, message):
    with pytest.raises(UserError) as err:
        fs.Job(options={**SMALL, "run.out": str(tmp_path / "run")}, quiet=True, **given)
    assert _one_line(err) == message
    assert not (tmp_path / "run").exists()


def test_a_step_and_evaluate_given_by_name_are_the_builtins(tmp_path):
    result = _simulate(tmp_path, step="cross_entropy", evaluate="accuracy")
    assert result.summary["steps"] == 3


@pytest.mark.parametrize("model, name", [
    (nn.Sequential(nn.Flatten(), nn.Identity()), "a Sequential"),
    (nn.Linear(64, 10).requires_grad_(False), "a Linear"),
])
def test_a_model_instance_with_nothing_to_train_is_one_line(tmp_path, model, name):
    with pytest.raises(UserError) as err:
        _simulate(tmp_path, model=model)
    assert _one_line(err).startswith(f"the model argument ({name}) has no parameters to train")


def _scheduler(params):
    return torch.optim.lr_scheduler.StepLR(torch.optim.SGD(params, lr=0.1), 1)


MUST_OPTIMIZER = "the optimizer argument must be a function(params) -> torch.optim.Optimizer"


@pytest.mark.parametrize("optimizer, message", [
    (lambda params: 5, f"{MUST_OPTIMIZER}; it returned an int"),
    (lambda params: None, f"{MUST_OPTIMIZER}; it returned a NoneType"),
    (_scheduler, f"{MUST_OPTIMIZER}; it returned a StepLR"),
    (lambda: torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1),
     f"{MUST_OPTIMIZER}; tests.test_user_code:<lambda> does not take one argument"),
    (torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1),
     f"{MUST_OPTIMIZER}; got an SGD instance: pass a function, e.g. lambda params: "
     "torch.optim.SGD(params, lr=0.05)"),
    (5, f"{MUST_OPTIMIZER}; got an int"),
    (lambda params: torch.optim.LBFGS(params),
     "the optimizer argument makes an LBFGS: LBFGS needs a closure, which fastsgd's loop "
     "does not give"),
])
def test_an_optimizer_argument_that_makes_no_optimizer_is_one_line(tmp_path, optimizer,
                                                                   message):
    with pytest.raises(UserError) as err:
        fs.Job(optimizer=optimizer, options={**SMALL, "run.out": str(tmp_path / "run")},
               quiet=True)
    assert _one_line(err).startswith(message)
    assert not (tmp_path / "run").exists()


def test_an_optimizer_named_in_the_config_that_needs_a_closure_is_one_line():
    with pytest.raises(ConfigError) as err:
        fs.Job(options={**SMALL, "optimizer.name": "torch.optim:LBFGS"}, quiet=True)
    assert _one_line(err).startswith("optimizer.name = 'torch.optim:LBFGS' makes an LBFGS: "
                                     "LBFGS needs a closure")


@pytest.mark.parametrize("given, message", [
    ({"strategy": fs.AllReduce}, "strategy must be a name or a strategy instance such as "
                                 "fs.AllReduce(); got the class AllReduce (call it)"),
    ({"strategy": 5}, "strategy must be a name or a strategy instance such as "
                      "fs.AllReduce(); got an int"),
    ({"compressor": fs.compress.TopK}, "compressor must be a name or a compressor instance "
                                       "such as fs.compress.TopK(ratio=0.01); got the class "
                                       "TopK (call it)"),
])
def test_a_strategy_or_compressor_that_is_no_instance_is_one_line(given, message):
    with pytest.raises(UserError) as err:
        fs.Job(options=SMALL, quiet=True, **given)
    assert _one_line(err) == message


@pytest.mark.parametrize("given, message", [
    ({"options": [("run.steps", 3)]}, "options must be a dict of 'section.key': value; got a "
                                      "list"),
    ({"config": 5}, "config must be a TOML file's path or a dict; got an int"),
])
def test_config_and_options_of_another_type_are_one_line(given, message):
    with pytest.raises(UserError) as err:
        fs.Job(quiet=True, **given)
    assert _one_line(err) == message
