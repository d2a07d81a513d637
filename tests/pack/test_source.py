"""`fastsgd pack train.py`: an error in importing the user's script is one line that names
the script and its own line, with exit code 2."""

import pytest

from fastsgd.cli import main


@pytest.mark.parametrize("text, says", [
    ("import os\nimport nonexistent_module_xyz\n",
     ", line 2: ModuleNotFoundError: No module named 'nonexistent_module_xyz'"),
    ("def f():\n    raise RuntimeError('boom\\nsecond line')\n\n\nf()\n",
     ", line 2: RuntimeError: boom"),
    ("import sys\nsys.exit(3)\n", ", line 2: SystemExit: 3"),
    # a syntax error in a module it imports: the script's import line, not that module's
    ("import os\nimport broken_helper_xyz\n",
     ", line 2: SyntaxError: '(' was never closed (broken_helper_xyz.py, line 1)"),
])
def test_an_error_in_importing_the_script_is_one_line_at_its_line(tmp_path, capsys, text, says):
    (tmp_path / "broken_helper_xyz.py").write_text("x = (\n")
    script = tmp_path / "train.py"
    script.write_text(text)
    assert main(["pack", str(script)]) == 2
    assert capsys.readouterr().err == f"fastsgd: error: {script}{says}\n"


@pytest.mark.parametrize("source, says", [
    ("twojobs.py:", "twojobs.py:: the job's name after ':' is empty; write twojobs.py:NAME"),
    ("job.fsj", "job.fsj is a job archive already: train it with fastsgd run job.fsj"),
])
def test_what_cannot_be_packed_is_named(tmp_path, monkeypatch, capsys, source, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "twojobs.py").write_text("")
    (tmp_path / "job.fsj").write_bytes(b"PK")
    assert main(["pack", source]) == 2
    assert capsys.readouterr().err == f"fastsgd: error: {says}\n"
