"""A run's config.toml says what ran, also for objects given to the Python API, and re-running
it repeats the run or refuses in one line."""

import copy
import re
import subprocess
import sys

import pytest
import torch

import fastsgd as fs
from fastsgd.compress import TopK
from fastsgd.config import schema as cfg
from fastsgd.config.objects import import_path, resolve
from fastsgd.errors import ConfigError
from fastsgd.loop.components import record
from fastsgd.loop.kit.optimizers import record_optimizer
from fastsgd.strategies import CHOICES


class SmallCNN(torch.nn.Module):
    """The user's own model, in an importable module (this one)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def adam(params):
    return torch.optim.Adam(params, lr=2e-3, betas=(0.8, 0.99))


def squared_hinge(model, batch):
    x, y = batch
    return torch.nn.functional.multi_margin_loss(model(x), y, p=2)


def fastsgd(*args, cwd):
    return subprocess.run([sys.executable, "-m", "fastsgd", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_import_paths_are_the_shortest_public_ones():
    assert import_path(torch.optim.Adam) == "torch.optim:Adam"
    assert import_path(SmallCNN) == f"{__name__}:SmallCNN"
    assert resolve(import_path(SmallCNN), "model.name") is SmallCNN


@pytest.mark.parametrize("value, why", [
    ("__main__:Net", "defined in the script that was run (__main__)"),
    ("mod:<lambda>", "it was a lambda"),
    ("mod:f.<locals>.Net", "defined inside a function"),
    ("<instance of mod:Net>", "a Python object given to the API"),
    ("no_such_module_xyz:Net", "cannot import no_such_module_xyz"),
    ("torch.optim:NoSuchOptimizer", "torch.optim has no NoSuchOptimizer"),
])
def test_what_cannot_be_rebuilt_is_refused_in_one_line(value, why):
    with pytest.raises(ConfigError) as err:
        resolve(value, "model.name")
    assert why in str(err.value) and "model.name" in str(err.value)
    assert "\n" not in str(err.value)


def test_optimizer_is_recorded_as_its_class_and_defaults():
    sgd = record_optimizer(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5))
    assert sgd["name"] == "torch.optim:SGD" and sgd["lr"] == 0.1 and sgd["momentum"] == 0.5
    assert record_optimizer(adam)["betas"] == [0.8, 0.99]

    def two_groups(params):
        first, *rest = params
        return torch.optim.SGD([{"params": [first], "lr": 1.0}, {"params": rest}], lr=0.1)

    # parameter groups are more than the defaults say: the factory itself is recorded
    assert record_optimizer(two_groups) == {"name": import_path(two_groups)}
    assert "<locals>" in import_path(two_groups)


def test_strategy_and_codec_objects_are_recorded_with_their_options():
    sections = record(strategy=fs.AllReduce(bucket_mb=4), compressor=TopK(ratio=0.05))
    assert sections["strategy"] == {"name": "allreduce", "bucket_mb": 4.0, "overlap": True,
                                    "momentum_correction": "auto", "keep_residual": True}
    assert sections["compression"] == {"name": "topk", "ratio": 0.05, "error_feedback": True}


@pytest.mark.parametrize("build, culprit", [
    (lambda: fs.AllReduce(bucket_mb=-1), "strategy.bucket_mb must be > 0, got -1"),
    (lambda: fs.AllReduce(bucket_mb="4"), "strategy.bucket_mb must be of type float, got '4'"),
    (lambda: TopK(ratio=2.0), "compression.ratio must be in (0, 1], got 2.0"),
    (lambda: fs.AllReduce(bucket=4), "unexpected keyword argument 'bucket'"),
])
def test_objects_built_in_python_get_the_cli_checks(build, culprit):
    with pytest.raises(ConfigError) as err:
        build()
    assert culprit in str(err.value)


def test_dataset_object_that_a_file_cannot_rebuild(synthetic, tmp_path):
    handmade = fs.data.Dataset("mine", synthetic.train_x, synthetic.train_y, synthetic.test_x,
                               synthetic.test_y, synthetic.num_classes)
    job = fs.Job(model="mlp", data=handmade, quiet=True,
                 options={"run.steps": 2, "run.out": str(tmp_path / "r")})
    result = job.simulate(workers=2)
    with pytest.raises(ConfigError, match=r"data.name = '<Dataset 'mine' built in Python>'"):
        fs.Job(config=result.run_dir / "config.toml").simulate()


def test_model_instance_is_copied_for_each_worker(synthetic, tmp_path):
    model = SmallCNN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    job = fs.Job(model=model, data=synthetic, quiet=True,
                 options={"run.steps": 5, "run.out": str(tmp_path / "r")})
    result = job.simulate(workers=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    trained = torch.load(result.run_dir / "model.pt", weights_only=True)
    assert not torch.equal(trained["fc.weight"], before["fc.weight"])
    assert cfg.load(CHOICES, result.run_dir / "config.toml")["model"]["name"] == \
        f"<instance of {__name__}:SmallCNN>"


def test_lambda_model_refuses_to_rerun_from_the_file(synthetic, tmp_path):
    job = fs.Job(model=lambda: SmallCNN(), data="synthetic", quiet=True,
                 options={"run.steps": 2, "run.out": str(tmp_path / "r")})
    run_dir = job.simulate(workers=2).run_dir
    proc = fastsgd("simulate", str(run_dir / "config.toml"), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model.name" in proc.stderr and "it was a lambda" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.multiproc
def test_custom_model_and_adam_rerun_from_the_cli_bitwise(tmp_path):
    """The issue's acceptance test: the API run and the CLI re-run of its config.toml give
    bitwise the same model.pt, in a new run directory, leaving the first run whole."""
    original = fs.Job(model=SmallCNN, optimizer=adam, step=squared_hinge, data="synthetic",
                      strategy=fs.AllReduce(bucket_mb=0.01), quiet=True,
                      options={"run.steps": 12, "run.eval_every": 0, "data.batch_size": 16,
                               "run.out": str(tmp_path / "runs" / "first")})
    first = original.run(workers=2)
    recorded = cfg.load(CHOICES, first.run_dir / "config.toml")
    assert {k: recorded["model"][k] for k in ("name", "evaluate", "step", "packed")} == {
        "name": f"{__name__}:SmallCNN", "evaluate": "accuracy",
        "step": f"{__name__}:squared_hinge", "packed": ""}
    assert recorded["optimizer"]["name"] == "torch.optim:Adam"
    assert recorded["optimizer"]["betas"] == [0.8, 0.99]
    assert recorded["strategy"] == {"name": "allreduce", "bucket_mb": 0.01, "overlap": True,
                                    "momentum_correction": "auto", "keep_residual": True}

    proc = fastsgd("run", "--quiet", str(first.run_dir / "config.toml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    again = tmp_path / "runs" / "first-2"
    assert f"run directory  {again}" in proc.stdout
    a = torch.load(first.run_dir / "model.pt", weights_only=True)
    b = torch.load(again / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (first.run_dir / "summary.json").exists() and (first.run_dir / "eval.jsonl").exists()


class HalfBucketAllReduce(fs.AllReduce):
    """A user's own strategy class: not in the registry, so recorded by import path."""

    name = "half_bucket_allreduce"


def test_own_strategy_class_is_recorded_and_rebuilt(synthetic, tmp_path):
    options = {"run.steps": 6, "data.batch_size": 16, "run.out": str(tmp_path / "a")}
    first = fs.Job(model="mlp", data="synthetic", strategy=HalfBucketAllReduce(bucket_mb=0.5),
                   quiet=True, options=options).simulate(workers=2)
    recorded = cfg.load(CHOICES, first.run_dir / "config.toml")["strategy"]
    assert recorded == {"name": f"{__name__}:HalfBucketAllReduce", "bucket_mb": 0.5,
                        "overlap": True, "momentum_correction": "auto", "keep_residual": True}
    again = fs.Job(config=first.run_dir / "config.toml", quiet=True).simulate()
    assert again.run_dir == tmp_path / "a-2"
    a = torch.load(first.run_dir / "model.pt", weights_only=True)
    b = torch.load(again.run_dir / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("section", [
    {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4},
    {"name": "sgd", "lr": 0.05, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0},
    {"name": "adam", "lr": 1e-3, "weight_decay": 1e-4}])
def test_config_optimizers_take_the_bits_of_torchs_default_path(section, synthetic):
    """sgd and adam from [optimizer] run torch's multi-tensor update (fewer calls per step):
    the parameters are those of the optimizer as torch builds it by default, bit for bit."""
    from fastsgd.loop.kit.optimizers import optimizer_from_config

    kwargs = {k: v for k, v in section.items() if k != "name"}
    default = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[section["name"]]
    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 10))
    theirs = copy.deepcopy(ours)
    steppers = [(ours, optimizer_from_config(section)(ours.parameters())),
                (theirs, default(theirs.parameters(), **kwargs))]
    assert steppers[0][1].defaults["foreach"] and not steppers[1][1].defaults["foreach"]
    for k in range(4):
        x, y = synthetic.train_x[32 * k:32 * (k + 1)], synthetic.train_y[32 * k:32 * (k + 1)]
        for model, optimizer in steppers:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters()))


SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 2}


@pytest.mark.parametrize("options, message", [
    ({"optimizer.name": "torch.optim:Adam", "optimizer.momentum": 0.9},
     "optimizer.name = 'torch.optim:Adam': Adam.__init__() got an unexpected keyword "
     "argument 'momentum'"),
    ({"optimizer.name": "torch.optim:SGD", "optimizer.lr": -1},
     "optimizer.name = 'torch.optim:SGD': Invalid learning rate: -1"),
    ({"optimizer.name": "torch.nn:Linear"},
     "optimizer.name = 'torch.nn:Linear' names a class that is not a torch.optim.Optimizer"),
])
def test_what_a_named_optimizer_refuses_is_one_line(options, message):
    with pytest.raises(ConfigError) as err:
        fs.Job(options={**SMALL, **options}, quiet=True)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# An import path naming the wrong kind of object is refused when the config is read, in one
# line that says what the key must name.
@pytest.mark.parametrize("key, must", [
    ("strategy.name", "a strategy class"), ("compression.name", "a compressor class"),
    ("optimizer.name", "a torch.optim.Optimizer class"),
    ("model.step", "a function(model, batch) -> loss"),
    ("model.name", "a class or function making a torch.nn.Module with no arguments")])
def test_an_import_path_naming_a_module_says_what_the_key_must_name(key, must):
    with pytest.raises(ConfigError, match=f"^{key} = 'os:path' names a module; it must "
                                          f"name {re.escape(must)}"):
        fs.Job(options={**SMALL, key: "os:path"}, quiet=True)


def test_a_step_taking_other_arguments_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"model.step = 'os:getcwd' does not take 2 "
                                          r"arguments; it must name a function\(model, batch"):
        fs.Job(options={**SMALL, "model.step": "os:getcwd"}, quiet=True)


@pytest.mark.parametrize("value, message", [
    ("torch.nn:Linear", "model.name = 'torch.nn:Linear': Linear.__init__() missing 2 "
                        "required positional arguments"),
    ("os:getcwd", "model.name = 'os:getcwd' made a str, not a torch.nn.Module"),
    ("torch.nn:Flatten", "model.name = 'torch.nn:Flatten' made a Flatten without parameters"),
])
def test_a_model_factory_that_makes_no_model_is_one_line(tmp_path, value, message):
    job = fs.Job(options={**SMALL, "model.name": value, "run.out": str(tmp_path / "run")},
                 quiet=True)
    with pytest.raises(ConfigError) as err:
        job.simulate()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def _makes_a_number() -> int:
    return 5


@pytest.mark.parametrize("model, message", [
    (torch.nn.Linear, "the model argument torch.nn:Linear: Linear.__init__() missing 2 "
                      "required positional arguments"),
    (_makes_a_number, "the model argument tests.loop.test_components:_makes_a_number made an int, "
                      "not a torch.nn.Module"),
    (torch.nn.ReLU, "the model argument torch.nn:ReLU made a ReLU without parameters"),
])
def test_a_model_argument_that_makes_no_model_is_one_line(tmp_path, model, message):
    job = fs.Job(model=model, options={**SMALL, "run.out": str(tmp_path / "run")}, quiet=True)
    with pytest.raises(ConfigError) as err:
        job.simulate()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
