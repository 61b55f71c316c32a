#!/usr/bin/env bash
# One-command GPU check for a Linux machine with one NVIDIA GPU (torch with CUDA, triton, ninja, nvcc installed;
# nothing downloaded): builds the CUDA extension, runs every op test on the GPU (all backends x fp32/fp16/bf16),
# measures the ceilings (copy bandwidth, bf16 GEMM) and times each op x backend, runs the kernel and model
# benchmarks in quick mode, and writes OUT/gpu_check.json plus a summary table. Budget: under 8 minutes.
#
#   bench/gpu_check.sh OUT_DIR
#
# Environment: PYTHON (default python3), FASTENC_CUDA_ARCHS (default: this GPU's arch only, to build fast),
# FASTENC_EXT_DIR (default /tmp/fastenc-gpu-check-ext), GPU_CHECK_BUDGET_S (default 450).
set -u -o pipefail

if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: bench/gpu_check.sh OUT_DIR" >&2
  exit 64
fi
mkdir -p "$1" && OUT=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
START=$SECONDS
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# ---------------------------------------------------------------- is there a GPU?
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing or it sees no device). This check needs a CUDA GPU;" >&2
  echo "gpu_check: on a CPU-only machine run 'python -m pytest tests' instead." >&2
  exit 2
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: $PY's torch has no CUDA or sees no GPU (torch.cuda.is_available() is False)." >&2
  exit 2
fi
if ! "$PY" -c "import fastenc.kernels" 2>/dev/null; then
  # Not installed: an editable install of this checkout needs no download (no dependencies, no isolation).
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || {
    echo "gpu_check: fastenc is not importable and 'pip install --no-deps -e .' failed (see $OUT/install.log)" >&2
    exit 2
  }
fi
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
ARCH=$("$PY" -c "import torch; ma, mi = torch.cuda.get_device_capability(); print(f'{ma}{mi}')")
export FASTENC_CUDA_ARCHS=${FASTENC_CUDA_ARCHS:-$ARCH}
export FASTENC_EXT_DIR=${FASTENC_EXT_DIR:-/tmp/fastenc-gpu-check-ext}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
echo "gpu_check: $(nvidia-smi -L | head -1); archs $FASTENC_CUDA_ARCHS; output in $OUT; budget ${BUDGET}s"

: >"$OUT/steps.tsv"
# step NAME LIMIT_S CMD...: runs CMD under a timeout (capped by what is left of the budget), logs to OUT/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - (SECONDS - START) - 15))
  if [ "$left" -lt 20 ]; then
    echo "== $name: skipped, time budget spent"
    printf '%s\tskipped\t0\n' "$name" >>"$OUT/steps.tsv"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | tail -n 25
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "== $name: stopped at its ${limit}s limit"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/steps.tsv"
}

step build 180 "$PY" bench/gpu_check.py build --out "$OUT"
step measure 100 "$PY" bench/gpu_check.py measure --out "$OUT" --budget-s 70
step op_tests 210 "$PY" -m pytest -q -rs -p no:cacheprovider tests/ops --junitxml="$OUT/ops_junit.xml"
if "$PY" -m fastenc bench --help >/dev/null 2>&1; then
  step bench_kernels 60 "$PY" -m fastenc bench kernels --quick --device cuda --out "$OUT/bench_kernels" --no-plots
  step bench_models 45 "$PY" -m fastenc bench models --quick --device cuda --out "$OUT/bench_models" --no-plots
fi
"$PY" bench/gpu_check.py summarize --out "$OUT"
rc=$?
echo "gpu_check: done in $((SECONDS - START)) s"
exit $rc
