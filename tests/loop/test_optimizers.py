"""The optimizer of a Job (loop/optimizers.py): what config.toml records of the API's
factory is what `fastsgd run --resume` can build again (issue 51, D)."""

import os
import shutil
import subprocess
import sys
import textwrap

import torch

import fastsgd as fs
from fastsgd.config.objects import import_path
from fastsgd.loop.kit.optimizers import record_optimizer
from fastsgd.records import checkpoint


class TwoKnobAdamW(torch.optim.AdamW):
    """A user's AdamW that takes two of AdamW's options: its defaults hold all of them."""

    def __init__(self, params, lr=1e-3, weight_decay=0.01):
        super().__init__(params, lr=lr, weight_decay=weight_decay)


class FixedBetas(torch.optim.Adam):
    """Takes lr alone and sets betas itself: the recorded lr rebuilds it."""

    def __init__(self, params, lr=1e-3):
        super().__init__(params, lr=lr, betas=(0.8, 0.9))


def test_a_subclass_is_recorded_with_the_options_its_constructor_takes():
    recorded = record_optimizer(lambda p: TwoKnobAdamW(p, lr=0.02))
    assert recorded == {"name": import_path(TwoKnobAdamW), "lr": 0.02, "weight_decay": 0.01}
    assert record_optimizer(lambda p: FixedBetas(p, lr=0.5)) == {
        "name": import_path(FixedBetas), "lr": 0.5}


def test_an_optimizer_its_keys_would_not_rebuild_is_recorded_as_its_factory():
    class Hidden(torch.optim.SGD):  # its momentum is not an argument, and not its default
        def __init__(self, params, lr=0.1):
            super().__init__(params, lr=lr)
            self.defaults["momentum"] = 0.7

    def factory(params):
        return Hidden(params)

    assert record_optimizer(factory) == {"name": import_path(factory)}


MODULE = textwrap.dedent("""
    import torch
    from fastsgd import Option, StrategyBase

    class Net(torch.nn.Sequential):
        def __init__(self):
            super().__init__(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(),
                             torch.nn.Linear(16, 10))

    class MyAdamW(torch.optim.AdamW):
        def __init__(self, params, lr=1e-3, weight_decay=0.01):
            super().__init__(params, lr=lr, weight_decay=weight_decay)

    class Average(StrategyBase):
        name = "average"
        OPTIONS = {"every": Option(int, 2)}

        def __init__(self, every=2):
            self.every = every

        def init(self, params, ctx):
            return {}

        def on_gradients(self, params, state, ctx):
            return None

        def on_parameters(self, params, state, ctx):
            if (ctx.step + 1) % self.every == 0 or ctx.last_step:
                for p in params:
                    ctx.transport.all_reduce(p.data, average=True)
""")


def test_the_printed_resume_command_goes_on_with_a_users_model_optimizer_and_strategy(
        tmp_path):
    (tmp_path / "mine.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        import mine
        options = {"data.name": "digits", "run.workers": 2, "run.steps": 6,
                   "run.checkpoint_every": 3, "run.eval_every": 0}
        straight = fs.Job(model=mine.Net, optimizer=lambda p: mine.MyAdamW(p, lr=0.01),
                          strategy=mine.Average(every=2), quiet=True, report=False,
                          options={**options, "run.out": str(tmp_path / "straight")}
                          ).simulate().run_dir
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mine", None)
    stopped = tmp_path / "stopped"  # what an interrupted run leaves: the checkpoint at 3
    shutil.copytree(straight, stopped)
    shutil.rmtree(checkpoint.step_dir(stopped, 6))
    for name in ("summary.json", "model.pt"):
        (stopped / name).unlink()
    # the user's module, then conftest's path: the resume runs this checkout, not whatever
    # fastsgd is installed (a shared editable install pointing at another tree differed)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "fastsgd", "simulate", "--resume",
                           str(stopped), "--quiet", "--no-report"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (stopped / "model.pt").read_bytes() == (straight / "model.pt").read_bytes()
