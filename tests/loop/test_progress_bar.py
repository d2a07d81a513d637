"""The progress bar of a run: its last line shows the final evaluation, and a language
model's validation loss (records/progress.py; worker.py follows the run's log)."""

import fastsgd as fs
from tests.workloads.test_text import _corpus


def _last_bar_line(err):
    return [line for line in err.replace("\r", "\n").splitlines() if "] " in line][-1]


def test_the_last_line_shows_the_final_accuracy(tmp_path, capsys):
    """In the simulator an evaluation is recorded once every worker handed its replica in,
    after worker 0 showed its step: at 100/100 the bar showed step 80's accuracy."""
    run = fs.Job(options={"run.steps": 20, "run.workers": 4, "run.eval_every": 5,
                          "data.name": "digits", "model.name": "mlp",
                          "compute.model": "fixed", "compute.step_time": "1ms",
                          "run.out": str(tmp_path / "run")}).simulate()
    line = _last_bar_line(capsys.readouterr().err)
    assert " 20/20 " in line and line.endswith(f"acc {run.accuracy:.2%}")


def test_a_language_model_shows_its_validation_loss(tmp_path, capsys):
    run = fs.Job(options={"run.steps": 4, "run.workers": 2, "data.name": "text",
                          "data.path": str(_corpus(tmp_path / "c")), "model.name": "gpt",
                          "model.layers": 1, "model.width": 16, "model.heads": 2,
                          "model.context": 16,
                          "data.batch_size": 4, "compute.model": "fixed",
                          "compute.step_time": "1ms", "run.out": str(tmp_path / "run")}).simulate()
    line = _last_bar_line(capsys.readouterr().err)
    assert " 4/4 " in line and line.endswith(f"val loss {run.loss:.4f}") and "acc" not in line
