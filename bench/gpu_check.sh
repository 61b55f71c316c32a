#!/usr/bin/env bash
# One-command GPU check for a Linux machine with one NVIDIA GPU (torch with CUDA, triton, ninja, nvcc installed;
# nothing downloaded). Steps, in order, each under its own time limit within one budget (default 440 s):
#   build       build and load the C++/CUDA extension (this GPU's arch only)
#   ops_cuda    op tests of the cuda backend     (FASTENC_TEST_BACKENDS=cuda,   pytest -k cuda)
#   ops_triton  op tests of the triton backend   (FASTENC_TEST_BACKENDS=triton, pytest -k triton)
#   ops_rest    the other op tests (reference on the GPU, cpu backend, bad input, ...)
#               each test process apart: a device fault poisons the CUDA context for every later test in it
#   measure     the quick cases of every op's benchmark spec (fastenc/benchmark/ops) x bf16/fp16/fp32: the
#               ceilings, time, GB/s or TFLOP/s, fraction of ceiling, ratio to the baselines, tolerance verdict
#   bench_*     optional: `fastenc bench kernels|models --quick --no-compile` (never fail the check)
# Results: OUT/gpu_check.json, rewritten after every step and every measured case (and on the early exits, with
# the reason), the logs OUT/<step>.log, junit reports OUT/ops_*.xml. Exit code: 0 passed, 1 failed (a step, an
# op test, a measured row with an error or out of tolerance), 2 aborted (no GPU, torch without CUDA, install
# failed), 3 incomplete (a required step cut at its limit or skipped for time: never reported as passed).
#
#   bench/gpu_check.sh [--dry-run] OUT_DIR
#
# --dry-run walks every step on a CPU machine with the GPU calls replaced: device cpu, the cpu and reference
# backends standing in for cuda and triton, a few tests selected with -k, tiny measurement cases.
# Environment: PYTHON (default python3), GPU_CHECK_BUDGET_S, FASTENC_CUDA_ARCHS (default: this GPU's arch),
# FASTENC_EXT_DIR (default /tmp/fastenc-gpu-check-ext).
set -u -o pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then
  DRY=1
  shift
fi
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: bench/gpu_check.sh [--dry-run] OUT_DIR" >&2
  exit 64
fi
mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 64
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
GC=bench/gpu_check.py
START=$SECONDS
RESERVE=15  # kept for the summary
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FASTENC_EXT_DIR=${FASTENC_EXT_DIR:-/tmp/fastenc-gpu-check-ext}
rm -f "$OUT/gpu_check.json" "$OUT"/ops_*.xml

if [ $DRY -eq 1 ]; then
  BUDGET=${GPU_CHECK_BUDGET_S:-300}
  DRYFLAG=--dry-run
  OPS=(tests/ops/test_gelu.py)
  # stand-ins: backend for the cuda slot, for the triton slot, and the rest; small -k selections
  CUDA_BE=cpu;        K_CUDA="cpu-fp32-1x384"
  TRITON_BE=reference; K_TRITON="reference-fp32-1x384"
  REST_BE=reference,cpu; K_REST="test_gelu_tails_and_specials and reference"
  DEVICE=cpu
  BENCH_K=(--ops gelu)
  BENCH_M=()  # a model on a CPU takes minutes: the dry run records the step as skipped
  L_BUILD=150 L_CUDA=60 L_TRITON=60 L_REST=60 L_MEASURE=90 L_BENCH_K=60 L_BENCH_M=0
else
  BUDGET=${GPU_CHECK_BUDGET_S:-440}
  DRYFLAG=
  OPS=(tests/ops)  # every op test file: backward tests (tests/ops/*backward*.py) included as they appear
  CUDA_BE=cuda;   K_CUDA="cuda"
  TRITON_BE=triton
  REST_BE=reference,cpu; K_REST="not cuda and not triton"
  # the sm_80/sm_90 compile check of the Triton kernels needs no GPU: CPU CI runs it, the budget here goes to the GPU
  K_TRITON="triton and not compiles_for_sm90"
  DEVICE=cuda
  BENCH_K=()
  BENCH_M=(--models bert-base --providers fastenc,hf-sdpa)
  L_BUILD=180 L_CUDA=90 L_TRITON=170 L_REST=50 L_MEASURE=100 L_BENCH_K=60 L_BENCH_M=45
fi

# abort REASON: an early exit, recorded in the JSON (by hand if Python itself cannot run).
abort() {
  if ! "$PY" "$GC" abort --out "$OUT" --reason "$1"; then
    printf '{"status": "aborted", "reason": "%s", "dry_run": %s, "steps": []}\n' \
      "$(printf '%s' "$1" | tr -d '"\\')" "$([ $DRY -eq 1 ] && echo true || echo false)" >"$OUT/gpu_check.json"
    echo "gpu_check: $1" >&2
  fi
  exit 2
}
trap 'abort "interrupted by a signal after $((SECONDS - START)) s"' INT TERM

command -v "$PY" >/dev/null 2>&1 || abort "no Python interpreter '$PY' (set PYTHON)"
"$PY" "$GC" init --out "$OUT" $DRYFLAG --budget-s "$BUDGET" || abort "$PY cannot run $GC (see the message above)"

# ---------------------------------------------------------------- is there a GPU? (replaced in a dry run)
if [ $DRY -eq 0 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    abort "no NVIDIA GPU here (nvidia-smi missing or it sees no device); on a CPU machine run 'python -m pytest tests'"
  fi
  "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)" 2>/dev/null \
    || abort "$PY's torch has no CUDA or sees no GPU (torch.cuda.is_available() is False)"
fi
if ! "$PY" -c "import fastenc.kernels" 2>/dev/null; then
  # Not installed: an editable install of this checkout needs no download (no dependencies, no isolation).
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || abort "fastenc is not importable and 'pip install --no-deps -e .' failed (see $OUT/install.log)"
fi
if [ $DRY -eq 0 ]; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
  ARCH=$("$PY" -c "import torch; ma, mi = torch.cuda.get_device_capability(); print(f'{ma}{mi}')")
  export FASTENC_CUDA_ARCHS=${FASTENC_CUDA_ARCHS:-$ARCH}
fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
echo "gpu_check: $([ $DRY -eq 1 ] && echo 'dry run on CPU' || nvidia-smi -L | head -1); output in $OUT; budget ${BUDGET}s"

# run_step NAME LIMIT_S OPTIONAL(0|1) JUNIT CMD...: CMD under `timeout -s INT` (pytest still writes its junit
# report when cut), capped by what is left of the budget; logs to OUT/NAME.log; recorded in the JSON.
run_step() {
  local name=$1 limit=$2 optional=$3 junit=$4
  shift 4
  local opt=()
  [ "$optional" -eq 1 ] && opt=(--optional)
  local left=$((BUDGET - (SECONDS - START) - RESERVE))
  if [ "$left" -lt 20 ]; then
    echo "== $name: skipped, the ${BUDGET}s budget is spent"
    "$PY" "$GC" skip --out "$OUT" --name "$name" --reason "time budget of ${BUDGET}s spent" "${opt[@]}"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  export GPU_CHECK_STEP_LIMIT_S=$limit
  local t0=$SECONDS
  timeout -s INT --kill-after=20 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 12 "$OUT/$name.log"
  [ "$rc" -eq 124 ] && echo "== $name: cut at its ${limit}s limit"
  local jopt=()
  [ -n "$junit" ] && jopt=(--junit "$junit")
  "$PY" "$GC" step --out "$OUT" --name "$name" --rc "$rc" --seconds "$((SECONDS - t0))" --limit "$limit" \
    "${opt[@]}" "${jopt[@]}"
}

# op_tests STEP BACKENDS EXPR: sets OPCMD, the op tests of BACKENDS (-k EXPR) in a pytest process of their own;
# each outcome goes into the JSON as it happens (bench/plugins/gpu_check_progress.py), the junit report at the end
# (or, cut at the limit, on SIGINT).
op_tests() {
  OPCMD=(env FASTENC_TEST_BACKENDS="$2" GPU_CHECK_OUT="$OUT" GPU_CHECK_STEP="$1"
         PYTHONPATH="$PWD/bench/plugins:$PYTHONPATH" "$PY" -m pytest -q -rfE -p no:cacheprovider -p gpu_check_progress
         "${OPS[@]}" -k "$3" --junitxml="$OUT/$1.xml")
}

run_step build "$L_BUILD" 0 "" "$PY" "$GC" build --out "$OUT" $DRYFLAG
op_tests ops_cuda "$CUDA_BE" "$K_CUDA"
run_step ops_cuda "$L_CUDA" 0 "$OUT/ops_cuda.xml" "${OPCMD[@]}"
op_tests ops_triton "$TRITON_BE" "$K_TRITON"
run_step ops_triton "$L_TRITON" 0 "$OUT/ops_triton.xml" "${OPCMD[@]}"
op_tests ops_rest "$REST_BE" "$K_REST"
run_step ops_rest "$L_REST" 0 "$OUT/ops_rest.xml" "${OPCMD[@]}"
run_step measure "$L_MEASURE" 0 "" "$PY" "$GC" measure --out "$OUT" $DRYFLAG
run_step bench_kernels "$L_BENCH_K" 1 "" "$PY" -m fastenc bench kernels --quick --device "$DEVICE" --no-compile \
  --no-plots --out "$OUT/bench_kernels" "${BENCH_K[@]}"
if [ "$L_BENCH_M" -gt 0 ]; then
  run_step bench_models "$L_BENCH_M" 1 "" "$PY" -m fastenc bench models --quick --device "$DEVICE" --no-compile \
    --no-plots --out "$OUT/bench_models" "${BENCH_M[@]}"
else
  "$PY" "$GC" skip --out "$OUT" --name bench_models --optional --reason "dry run: a model on a CPU takes minutes"
fi

trap - INT TERM
"$PY" "$GC" summarize --out "$OUT"
rc=$?
echo "gpu_check: done in $((SECONDS - START)) s (exit code $rc)"
exit $rc
