#!/usr/bin/env bash
# Installs what fastsgd and its tests need on a fresh Debian machine: the Fashion-MNIST
# package, the CPU build of PyTorch (pinned: a bare `torch` pulls a multi-GB CUDA build),
# and the project itself in editable mode with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null
fi
PY="${PYTHON:-python3}"
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore torch==2.13.0
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore -e ".[test]"
