"""scripts/setup.sh without installing anything: apt-get, sudo and pip are stand-ins that log.

The real run (`bash scripts/setup.sh`, ~30 s, reinstalls fastsgd in editable mode) is left to CI,
which runs it before the tests.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"
SYSTEM_PYTHON = "/usr/bin/python3"
VENV_HINT = "python3 -m venv .venv && . .venv/bin/activate && bash scripts/setup.sh"

# A stand-in for pip: logs its arguments; `install ... torch==2.13.0` "installs" a fake torch
# that reports a CUDA build and no GPU.
FAKE_PIP = textwrap.dedent('''\
    import os, sys, sysconfig
    with open(os.environ["SETUP_LOG"], "a") as f:
        f.write("pip " + " ".join(sys.argv[1:]) + "\\n")
    if "torch==2.13.0" in sys.argv:
        site = sysconfig.get_path("purelib")
        os.makedirs(os.path.join(site, "torch"))
        with open(os.path.join(site, "torch", "__init__.py"), "w") as f:
            f.write("import types\\n__version__ = '2.13.0'\\n"
                    "version = types.SimpleNamespace(cuda='12.8')\\n"
                    "cuda = types.SimpleNamespace(is_available=lambda: False)\\n")
        os.makedirs(os.path.join(site, "torch-2.13.0.dist-info"))
        with open(os.path.join(site, "torch-2.13.0.dist-info", "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\\nName: torch\\nVersion: 2.13.0\\n")
''')


def _stub(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _run(tmp_path: Path, python: str, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Runs setup.sh with PYTHON=python; apt-get and sudo on PATH only log. Returns the log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "log"
    for name in ("apt-get", "sudo"):
        _stub(bin_dir / name, f'echo "{name} $*" >> "$SETUP_LOG"')
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("PIP_BREAK_SYSTEM_PACKAGES", "TORCH_INDEX_URL")}
    full_env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHON=python,
                    SETUP_LOG=str(log), **env)
    proc = subprocess.run(["bash", str(SETUP)], env=full_env, capture_output=True, text=True,
                          timeout=120)
    return proc, log.read_text().splitlines() if log.exists() else []


def _externally_managed(python: str) -> bool:
    check = ("import os, sys, sysconfig; sys.exit(not (sys.prefix == sys.base_prefix and os.path"
             ".isfile(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED'))))")
    return os.access(python, os.X_OK) and subprocess.run([python, "-c", check]).returncode == 0


def test_refuses_an_externally_managed_python_before_apt_or_pip(tmp_path):
    if not _externally_managed(SYSTEM_PYTHON):
        pytest.skip(f"{SYSTEM_PYTHON} is missing or not externally managed (no EXTERNALLY-MANAGED "
                    "marker in its stdlib directory), so there is nothing for setup.sh to refuse")
    # PYTHON is a wrapper that logs every call, so a pip call would show even though pip runs
    # as `python -m pip`.
    wrapper = _stub(tmp_path / "python3",
                    f'echo "python $*" >> "$SETUP_LOG"\nexec {SYSTEM_PYTHON} "$@"')
    proc, log = _run(tmp_path, str(wrapper))
    assert proc.returncode == 2, proc.stderr
    assert "externally managed" in proc.stderr and VENV_HINT in proc.stderr
    assert len(proc.stderr.splitlines()) == 2 and proc.stdout == ""
    assert log == ["python -"]  # the check itself; no apt-get, sudo or pip


def test_installs_torch_from_torch_index_url_then_skips_it(tmp_path):
    """A venv with no torch and a logging stand-in for pip (run twice: the rerun keeps torch)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "pip.py").write_text(FAKE_PIP)
    url = "http://torch-index.invalid/whl/cpu"

    proc, log = _run(tmp_path, python, TORCH_INDEX_URL=url)
    assert proc.returncode == 0, proc.stderr
    pip_calls = [line for line in log if line.startswith("pip ")]
    assert len(pip_calls) == 2, log
    assert pip_calls[0].startswith("pip install") and pip_calls[0].endswith(
        f"--index-url {url} torch==2.13.0")
    assert pip_calls[1].startswith("pip install") and pip_calls[1].endswith("-e .[test]")
    assert "--index-url" not in pip_calls[1]  # the CPU index is for torch only
    hint = [line for line in proc.stderr.splitlines() if "CUDA build" in line]
    assert len(hint) == 1 and "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in hint[0]

    (tmp_path / "log").unlink()
    proc, log = _run(tmp_path, python, TORCH_INDEX_URL=url)
    assert proc.returncode == 0, proc.stderr
    pip_calls = [line for line in log if line.startswith("pip ")]
    assert len(pip_calls) == 1 and pip_calls[0].endswith("-e .[test]"), log  # torch is kept
