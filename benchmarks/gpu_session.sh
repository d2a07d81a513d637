#!/usr/bin/env bash
# Every GPU check of fastsgd in one go, for a session lent a GPU for a few minutes:
#   bash benchmarks/gpu_session.sh [OUT]   (the device tool's $OUT by default)
# Each step has its own time limit and its output goes to OUT/<step>.txt; a step that fails
# does not stop the next; at most 480 s in all. Exits non-zero if any failed.
set -uo pipefail
out="${1:-${OUT:-/tmp/gpu_session}}"
mkdir -p "$out"
nvidia-smi -L > "$out/gpus.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())" \
  >> "$out/gpus.txt" 2>&1
failed=0
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  tail -n 5 "$out/$name.txt"
  [ "$rc" -eq 0 ] || { echo "!! $name exited $rc"; failed=1; }
}
step gpt_bf16 100 python3 benchmarks/gpt_overhead.py --device cuda --precision bf16
step gpt_fp32 80 python3 benchmarks/gpt_overhead.py --device cuda
step test_cuda 150 python3 -m pytest -q -p no:cacheprovider -n0 tests/transport/test_cuda.py
step gpu_check 150 python3 benchmarks/gpu_check.py --steps 300
exit $failed
