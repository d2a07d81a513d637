"""A failed cell is summarised, in the bench's own output, by what says why: its `fastsgd:
error:` line (a worker's traceback follows it in the cell's log), else the exception a
traceback ends in; not the middle of a traceback."""

import pytest

from fastsgd.bench.runner import told
from fastsgd.cli.main import main

SPEC = """
[bench]
mode = "simulate"

[base]
data.name = "digits"
model.name = "mlp"
model.step = "tests.launch.user_code:raises"
run.steps = 3
run.workers = 2
compute.model = "fixed"
compute.step_time = "2ms"

[axes]
"run.seed" = [1]
"""
TRACE = """Traceback (most recent call last):
  File "/x/fastsgd/loop/worker.py", line 55, in train
    return run(ctx)
           ^^^^^^^^
  File "/tmp/mystep.py", line 3, in raises
    raise ValueError("oops in user step")
ValueError: oops in user step
"""


def test_a_cells_error_line_is_its_summary():
    output = ("progress 1/3\rfastsgd: error: worker 0 failed in step 1 of strategy "
              "'allreduce': ValueError: oops in user step\n" + TRACE)
    assert told(output) == ("fastsgd: error: worker 0 failed in step 1 of strategy "
                            "'allreduce': ValueError: oops in user step")


def test_a_bare_traceback_is_summarised_by_its_exception():
    chained = TRACE + "\nDuring handling of the above exception, another exception occurred:\n\n"
    assert told("some output\n" + TRACE) == "ValueError: oops in user step"
    assert told(chained + TRACE.replace("ValueError: oops", "KeyError: 'x'")) == (
        "KeyError: 'x' in user step")


def test_other_output_is_summarised_by_its_last_lines():
    assert told("\n".join(str(i) for i in range(9))) == "4\n  5\n  6\n  7\n  8"
    assert told("") == ""


@pytest.mark.multiproc
def test_a_cell_whose_step_raises_is_summarised_by_its_error_line(tmp_path, capsys):
    spec = tmp_path / "sweep.toml"
    spec.write_text(SPEC)
    assert main(["bench", str(spec), "--out", str(tmp_path / "b"), "--quiet"]) == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("cell ")]
    assert len(said) == 1 and said[0].endswith(
        "failed: fastsgd: error: worker 0 failed in step 1 of strategy 'allreduce': "
        "ValueError: oops in user step"), err
    assert "^^^" not in err and "1 of 1 cells failed" in err
