#!/usr/bin/env bash
# Installs what fastsgd and its tests need on a fresh Debian machine: the Fashion-MNIST
# package, PyTorch pinned to 2.13.0 (kept if already installed), and the project itself in
# editable mode with its test extras, into $PYTHON (default python3).
# Where pip would pull the multi-GB CUDA build of torch from PyPI, take the CPU build instead:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

# First, before apt-get or pip: refuse where pip would (PEP 668: an externally managed
# Python outside a virtual environment, e.g. Debian's /usr/bin/python3), unless
# PIP_BREAK_SYSTEM_PACKAGES is set, as pip itself allows.
"$PY" - <<'EOF'
import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
override = os.environ.get("PIP_BREAK_SYSTEM_PACKAGES", "").lower() in ("1", "y", "yes", "t", "true", "on")
if sys.prefix == sys.base_prefix and os.path.isfile(marker) and not override:
    print(f"setup.sh: {sys.executable} is externally managed (PEP 668): pip won't install into it.\n"
          "Use a virtual environment: python3 -m venv .venv && . .venv/bin/activate && bash scripts/setup.sh",
          file=sys.stderr)
    sys.exit(2)
EOF

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null
fi

PIP=("$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore)
if ! "$PY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("torch").split("+")[0] != "2.13.0")' 2>/dev/null; then
  "${PIP[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
fi
"${PIP[@]}" -e ".[test]"

# A CUDA build on a machine without a GPU works, but is GBs more than needed: say so, once.
"$PY" - <<'EOF'
import sys, warnings
warnings.simplefilter("ignore")
import torch
if torch.version.cuda and not torch.cuda.is_available():
    print(f"setup.sh: torch {torch.__version__} is a CUDA build and there is no GPU; for the CPU build: "
          f"{sys.executable} -m pip uninstall -y torch && "
          "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh", file=sys.stderr)
EOF
