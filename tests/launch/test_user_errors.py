"""The user's own code that raises (model.step, a model's constructor) is told by `fastsgd
simulate` as `fastsgd run` tells it: one `fastsgd: error:` line naming the worker, the step
(or "while building its model"), the strategy and the exception, then the worker's traceback,
exit code 1; not a traceback of fastsgd's simulator."""

import multiprocessing as mp
import re

import pytest

from fastsgd.cli.main import main
from fastsgd.errors import WorkerFailed
from fastsgd.launch.forking import Told

USER = "tests.launch.user_code"
SIM = ["--quiet", "--no-report", "--set", "data.name=digits", "--set", "model.name=mlp",
       "--set", "run.steps=3", "--set", "run.workers=2", "--set", "compute.model=fixed",
       "--set", "compute.step_time=2ms"]
STEP = ("fastsgd: error: worker 0 failed in step 1 of strategy 'allreduce': ValueError: oops "
        "in user step")
MODEL = ("fastsgd: error: worker {} failed while building its model under strategy "
         "'allreduce': ValueError: oops in model")


def _fastsgd(command, tmp_path, capsys, *options):
    sets = [x for option in options for x in ("--set", option)]
    code = main([command, *SIM, "--set", f"run.out={tmp_path / 'run'}", *sets])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("lanes", ["-1", "0"])
def test_simulate_tells_a_step_that_raises_as_run_does(tmp_path, capsys, lanes):
    code, err = _fastsgd("simulate", tmp_path, capsys, f"model.step={USER}:raises",
                         f"compute.lanes={lanes}")
    first, _, trace = err.partition("\n")
    assert (code, first) == (1, STEP)
    assert trace.startswith("Traceback (most recent call last):")
    assert "user_code.py" in trace and "in raises" in trace  # the user's code: where it raised
    assert "scheduler.py" not in trace and "cli/main.py" not in trace  # not the simulator's
    assert trace.rstrip().endswith("ValueError: oops in user step")


def test_simulate_tells_a_model_whose_constructor_raises(tmp_path, capsys):
    code, err = _fastsgd("simulate", tmp_path, capsys, f"model.name={USER}:Boom")
    first, _, trace = err.partition("\n")
    assert (code, first) == (1, MODEL.format(0))
    assert "in __init__" in trace and "cli/main.py" not in trace


def test_simulate_tells_a_step_that_raises_while_profiled(tmp_path, capsys):
    code, err = _fastsgd("simulate", tmp_path, capsys, f"model.step={USER}:raises",
                         "compute.model=profile", "compute.step_time=")
    assert code == 1
    assert err.partition("\n")[0] == ('fastsgd: error: compute.model = "profile": the model '
                                      "or step raised while being profiled: ValueError: "
                                      "oops in user step")


def test_the_api_raises_worker_failed_with_its_rank_and_step(tmp_path):
    import fastsgd
    job = fastsgd.Job(step=f"{USER}:raises", quiet=True,
                      options={"data.name": "digits", "model.name": "mlp", "run.workers": 2,
                               "run.steps": 3, "compute.model": "fixed",
                               "compute.step_time": "2ms", "run.out": str(tmp_path / "run")})
    with pytest.raises(WorkerFailed, match="^worker 0 failed in step 1 of strategy "
                                           "'allreduce': ValueError: oops in user step\n"):
        job.simulate()


def test_a_run_told_of_a_worker_that_raised_building_its_model_names_no_step():
    trace = ('Traceback (most recent call last):\n  File "/x/fastsgd/loop/worker.py", line 43,'
             ' in train\n    model = plan.make_model().to(transport.device)\n            '
             '^^^^^^^^^^^^^^^^^\n  File "/tmp/m.py", line 6, in __init__\n    raise '
             'ValueError("oops in model")\nValueError: oops in model\n')
    errors = mp.get_context("fork").SimpleQueue()
    errors.put((1, "ValueError: oops in model", False, trace))
    failure = Told(errors, progress=[0, 0])(1, 1)
    assert str(failure).startswith("worker 1 failed while building its model: ValueError: "
                                   "oops in model\nTraceback")
    assert (failure.rank, failure.step, failure.died) == (1, None, False)


@pytest.mark.multiproc
def test_run_tells_a_model_whose_constructor_raises(tmp_path, capsys):
    code = main(["run", *SIM[:10], "--set", f"run.out={tmp_path / 'run'}",
                 "--set", f"model.name={USER}:Boom"])
    first = capsys.readouterr().err.partition("\n")[0]
    assert code == 1
    assert re.fullmatch(re.escape(MODEL).replace(r"\{\}", "[01]"), first), first
