#!/usr/bin/env bash
# The whole GPU pass in one device call (at most 10 minutes; 15 minutes of device time in all):
# build for the chip in front of us (the primitive layout check runs meanwhile); on sm_90 the
# Hopper GEMM test kernel against torch.mm (tests/cudasim/hopper_gemm.py), the sm_90a
# forward against float64 and SDPA (tests/cudasim/hopper_fwd.py), the FP8 forward
# (tests/cudasim/hopper_fp8_fwd.py), and the 16-bit one through the library with
# FLASHATTN_CUDA_HOPPER=1 (tests/cudasim/hopper_library_sample.py), the sm_90a backward alone
# and through the library (hopper_bwd.py, hopper_library_bwd_sample.py); the CUDA tests,
# with FA2's own tests through the adapter beside them when .fa2/ was carried, then
# compute-sanitizer memcheck and racecheck. Then, with the GPU to itself: the results page's two
# benchmarks at their default CUDA settings (`python -m flashattn.bench --json` and `python -m
# flashattn.bench decode --json`, written to $OUT/raw/results/h200/dense.json and decode.json,
# h100/ or a100/ on those GPUs, and copied from raw.tgz to bench/results/ afterwards); trimmed
# benchmarks against every SDPA backend (each figure printed next to tools/gpu_model.py's
# prediction), of a decoding step's (flash_attn_with_kvcache) KV bandwidth and of small calls'
# per-call and host time (`bench small --quick`); and Nsight
# Compute's counters for the model's d = 128 shape (tools/ncu_workload.py).
#
#   bash tools/gpu_check.sh          the log goes to $OUT/gpu_check.log, everything else to
#                                    $OUT/raw, packed into $OUT/raw.tgz (default OUT ./gpu-out)
#
# GPU_CHECK_DEADLINE_S (default 540) bounds the whole script, so a 600 s call returns with time
# to spare: each step runs under `timeout`, given what its cap allows of the time left (less
# SUMMARY_RESERVE_S), and a step with under 10 s left is skipped. Every step runs even if an
# earlier one failed (a partial run is a result too). The summary -- steps, then model against
# measurement -- is printed by an EXIT trap, whatever happens (a failure, a timeout, SIGTERM),
# and last, because the device tool returns only the tail of the output.
#
# Before a call, check here that every csrc source compiles against the GPU box's torch
# 2.11.0+cu130 headers at -std=c++17, which its cpp_extension uses
# (scripts/compile_check_torch.py --torch 2.11.0 --all-cu). A dry run on a machine without a
# GPU goes through every step (each failing for want of one) and packs raw.tgz. Two calls on
# 2026-12-01 (docs/lab/2026-12-01-h200-first-gpu-run.md) took 298 s and 380 s, before the
# results page's benchmarks (at most 150 s each) were added; the box started in about 30 s each
# time.
# The model's predictions come from the snapshot tools/gpu_model.json (rerun tools/gpu_model.py
# after kernel changes; --compare says when the snapshot's csrc differs).
set -uo pipefail
cd "$(dirname "$0")/.."
# The device tool brings back at most 8 files from $OUT: the log stays there, every other file
# goes to $OUT/raw, which the EXIT trap packs into $OUT/raw.tgz.
OUT_TOP=${OUT:-$PWD/gpu-out}
OUT=$OUT_TOP/raw
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ARCH=${FLASHATTN_CUDA_ARCHS:-90}
DEADLINE_S=${GPU_CHECK_DEADLINE_S:-540}
SUMMARY_RESERVE_S=15
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
exec > >(tee "$OUT_TOP/gpu_check.log") 2>&1

summary=()
failed=0
left() { echo $(( START + DEADLINE_S - SUMMARY_RESERVE_S - $(date +%s) )); }

record() {  # name result seconds
  summary+=("$(printf '%-14s %-22s %4d s' "$1" "$2" "$3")")
  [[ $2 == PASS ]] || failed=$(( failed + 1 ))
}

# GPU_CHECK_SKIP: step names to leave out (e.g. "layout racecheck" on a rerun that has less
# device time left); GPU_CHECK_XDIST: pytest-xdist workers for the CUDA tests (default 8).
skipped() {
  [[ " ${GPU_CHECK_SKIP:-} " == *" $1 "* ]] || return 1
  record "$1" "SKIPPED (asked)" 0
}

# step_limit NAME CAP_S: sets STEP_LIMIT to the step's time limit, min(CAP_S, time left); fails
# (and records the step as skipped) when it was asked to be left out or under 10 s are left.
# Not called as $(...): its records must reach this shell's summary.
step_limit() {
  skipped "$1" && return 1
  STEP_LIMIT=$(left)
  (( $2 < STEP_LIMIT )) && STEP_LIMIT=$2
  if (( STEP_LIMIT < 10 )); then
    record "$1" "SKIPPED (deadline)" 0
    return 1
  fi
}

record_exit() {  # NAME EXIT_STATUS SECONDS: PASS, TIMEOUT or FAIL
  case $2 in
    0) record "$1" PASS "$3" ;;
    124|137) record "$1" TIMEOUT "$3" ;;
    *) record "$1" "FAIL (exit $2)" "$3" ;;
  esac
}

# step NAME CAP_S CMD...: CMD under timeout min(CAP_S, time left).
step() {
  local name=$1 limit start rc
  step_limit "$1" "$2" || return 0
  limit=$STEP_LIMIT
  shift 2
  printf '\n== %s (at most %d s): %s\n' "$name" "$limit" "$*"
  start=$(date +%s)
  # In the background, so that a signal to this script is handled at once (bash runs traps
  # only between foreground commands); timeout leads its own process group.
  timeout --kill-after=10 "$limit" "$@" &
  STEP_PID=$! STEP_NAME=$name STEP_START=$start
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  record_exit "$name" "$rc" $(( $(date +%s) - start ))
}

# bg_step NAME CAP_S CMD...: like step, but CMD runs in the background (output in
# $OUT/NAME.log) while later steps go on; bg_wait NAME collects it.
declare -A BG_PID=()
bg_step() {
  local name=$1 limit
  step_limit "$1" "$2" || return 0
  limit=$STEP_LIMIT
  shift 2
  printf '\n== %s (in the background, at most %d s): %s\n' "$name" "$limit" "$*"
  rm -f "$OUT/$name.rc" "$OUT/$name.pid"
  (
    start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1 &
    echo $! >"$OUT/$name.pid"
    wait $!
    echo "$? $(( $(date +%s) - start ))" >"$OUT/$name.rc"
  ) &
  BG_PID[$name]=$!
}

bg_wait() {  # NAME: wait for it, show the end of its log, record its result
  local name=$1 rc secs
  [[ -n ${BG_PID[$name]:-} ]] || return 0
  printf '\n== %s (ran in the background): waiting\n' "$name"
  wait "${BG_PID[$name]}"
  unset "BG_PID[$name]"
  tail -n 40 "$OUT/$name.log"
  read -r rc secs <"$OUT/$name.rc" || { rc=1; secs=0; }
  record_exit "$name" "$rc" "$secs"
}

stop_children() {
  local name
  if [[ -n ${STEP_PID:-} ]]; then
    kill -TERM -- "-$STEP_PID" 2>/dev/null
    record "$STEP_NAME" INTERRUPTED $(( $(date +%s) - STEP_START ))
  fi
  for name in "${!BG_PID[@]}"; do
    # timeout leads its own process group: the whole background command goes
    [[ -s $OUT/$name.pid ]] && kill -TERM -- "-$(cat "$OUT/$name.pid")" 2>/dev/null
    kill -TERM "${BG_PID[$name]}" 2>/dev/null
    record "$name" INTERRUPTED 0
  done
  STEP_PID=
  BG_PID=()
}

finish() {
  local rc=$?
  trap - EXIT INT TERM
  stop_children
  (( rc == 0 && failed > 0 )) && rc=1
  printf '\n== model vs measured (tools/gpu_model.json: modeled on %s)\n' "${MODEL_GPU:-h200}"
  $PY tools/gpu_model.py --compare "$OUT"/bench-*.json "$OUT"/results/*/dense.json \
    --model tools/gpu_model.json --gpu "${MODEL_GPU:-h200}" 2>&1 || true
  printf '\n== summary (%s, %d s of %d)\n' "$(date -u)" $(( $(date +%s) - START )) "$DEADLINE_S"
  printf '%s\n' "${summary[@]}"
  (( failed )) && printf '%d step(s) did not pass\n' "$failed"
  tar czf "$OUT_TOP/raw.tgz" -C "$OUT_TOP" raw && echo "files: $OUT_TOP/raw.tgz"
  exit $rc
}
trap finish EXIT
trap 'echo "gpu_check: interrupted"; stop_children; exit 143' INT TERM

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)" in
  *H100*) MODEL_GPU=h100 ;;
  *A100*) MODEL_GPU=a100 ;;
  *) MODEL_GPU=h200 ;;
esac

# The layout check builds its own nvcc and g++ programs: it runs while the extension builds.
# On sm_90 it is built for sm_90a, which adds the Hopper primitives' cases (TMA, wgmma).
LAYOUT_ARCH=$ARCH
[[ $ARCH == 90 ]] && LAYOUT_ARCH=90a
bg_step layout 300 $PY tests/cudasim/layout_check.py --arch "$LAYOUT_ARCH"
STEP_PID=

# Not FLASHATTN_PTXAS_STRICT: a spill must not cost the whole run (ptxas warns in the log).
step build 330 bash -c "set -o pipefail; env FLASHATTN_CUDA=1 FLASHATTN_CUDA_ARCHS=$ARCH \
  MAX_JOBS=$(nproc) $PY setup.py build_ext --inplace 2>&1 | tee $OUT/build.log | tail -n 30"
bg_wait layout
# The Hopper GEMM test kernel (TMA -> mbarrier -> wgmma, issue 31 stage 3): bit for bit against
# torch.mm, and its TFLOP/s beside torch.mm's, while the GPU is still idle (SKIP off sm_90).
step hopper-gemm 120 bash -c "set -o pipefail; $PY tests/cudasim/hopper_gemm.py 2>&1 | tee $OUT/hopper-gemm.log"
# The standalone sm_90a forward (csrc/cuda/hopper/, issue 31 stage 4):
# its nvcc build (about a minute), a correctness sample against float64 and its TFLOP/s beside
# SDPA's cuDNN and flash backends (SKIP off sm_90).
step hopper-fwd 150 bash -c "set -o pipefail; $PY tests/cudasim/hopper_fwd.py --ptxas 2>&1 | tee $OUT/hopper-fwd.log"
# The standalone sm_90a FP8 (e4m3) forward at d = 128 (issue 31 stage 6; the library's FP8 calls
# are sampled by hopper-lib below): its build, a correctness sample against float64 on the dequantized inputs and its
# TFLOP/s beside cuDNN's FP8 SDPA where torch takes float8, and bf16 SDPA (SKIP off sm_90).
step hopper-fp8-fwd 120 bash -c "set -o pipefail; $PY tests/cudasim/hopper_fp8_fwd.py --ptxas 2>&1 | tee $OUT/hopper-fp8-fwd.log"
# The same kernels through the library (FLASHATTN_CUDA_HOPPER=1, plan_fwd_sm90.h), as built by
# the build step: a correctness sample against float64, the profiler's kernel names showing the
# Hopper kernel ran (and sm_80's for a call it does not take), and the library's forward TFLOP/s
# (SKIP off sm_90).
step hopper-lib 180 bash -c "set -o pipefail; env FLASHATTN_CUDA_HOPPER=1 $PY tests/cudasim/hopper_library_sample.py 2>&1 | tee $OUT/hopper-lib.log"
# The standalone sm_90a backward (csrc/cuda/hopper/bwd_sm90_*, issue 31 stage 5): its build,
# dQ/dK/dV against float64 and its TFLOP/s (SKIP off sm_90).
step hopper-bwd 150 bash -c "set -o pipefail; $PY tests/cudasim/hopper_bwd.py --ptxas 2>&1 | tee $OUT/hopper-bwd.log"
# The same backward through the library (FLASHATTN_CUDA_HOPPER=1, plan_bwd_sm90.h): autograd
# against float64 and which kernels ran (SKIP off sm_90).
step hopper-lib-bwd 90 bash -c "set -o pipefail; env FLASHATTN_CUDA_HOPPER=1 $PY tests/cudasim/hopper_library_bwd_sample.py 2>&1 | tee $OUT/hopper-lib-bwd.log"

# FlashAttention-2's own tests/test_flash_attn.py through the adapter (a flash_attn package
# backed by flashattn, FA2's test file, the case sampler): it is kept outside the repository,
# so it runs only when a copy was carried to .fa2/. They run beside our tests and the
# sanitizers, and are waited for before the benchmarks, which must have the GPU to themselves.
if [[ -f .fa2/test_flash_attn.py ]]; then
  fa2() {  # NAME CAP_S SAMPLER_ARGS... TEST_FILE::FUNCTION...
    local name=$1 cap=$2
    shift 2
    bg_step "$name" "$cap" env PYTHONPATH="$PWD/.fa2:$PWD" bash -c 'cd .fa2 && exec "$@"' _ \
      $PY -m pytest -c pytest.ini --rootdir . -p fa2_sampler -q -rf --tb=line \
      --junitxml "$OUT/$name.xml" --fa2-out-dir "$OUT/$name" --fa2-seed 1 --fa2-cover \
      --fa2-max-est-s 1e9 --fa2-max-est-gib 40 --fa2-skip-n 0 "$@"
  }
  fa2 fa2-kvcache 200 --fa2-per-func 120 --fa2-paged-n 40 \
    test_flash_attn.py::test_flash_attn_kvcache test_flash_attn.py::test_flash_attn_splitkv \
    test_flash_attn.py::test_flash_attn_varlen_paged_kv_num_splits \
    test_flash_attn.py::test_flash_attn_kvcache_paged_block_table_bounds
  [[ -f .fa2/test_flash_attn_smallpages.py ]] && fa2 fa2-smallpages 200 --fa2-per-func 0 \
    --fa2-paged-n 80 test_flash_attn_smallpages.py::test_flash_attn_kvcache
  [[ -f .fa2/test_flash_attn_batchidx.py ]] && fa2 fa2-batchidx 200 --fa2-per-func 40 \
    test_flash_attn_batchidx.py::test_flash_attn_kvcache
  fa2 fa2-dense 200 --fa2-per-func 40 --fa2-dropout-n 4 --fa2-paged-n 4 \
    --fa2-n test_flash_attn_deterministic=8 \
    test_flash_attn.py::test_flash_attn_output test_flash_attn.py::test_flash_attn_causal \
    test_flash_attn.py::test_flash_attn_qkvpacked test_flash_attn.py::test_flash_attn_bwd_overflow \
    test_flash_attn.py::test_flash_attn_deterministic test_flash_attn.py::test_flash_attn_varlen_output \
    test_flash_attn.py::test_flash_attn_varlen_causal
fi

# pytest-xdist workers when it is there (the box has it): the matrix is ~860 cases, and their
# float64 references run on the CPU (4 workers beside the FA2 runs: 239 cases in 108 s).
# `-m "not shim"`: tests of the CUDA source on the CPU shim also match `-k cuda` (conftest.py).
# Each result goes to cuda-tests.log as it comes (-v), so a timeout still leaves the list
# (junit XML is written only at the end); failures and the tail are printed.
XDIST=()
$PY -c 'import xdist' 2>/dev/null && XDIST=(-n "${GPU_CHECK_XDIST:-8}")
step cuda-tests 240 bash -c "$PY -m pytest tests -v --maxfail=30 -k cuda -m 'not slow and not shim' \
  -p no:cacheprovider ${XDIST[*]} --junitxml $OUT/cuda-tests.xml > $OUT/cuda-tests.log 2>&1
  rc=\$?; grep -E '(FAILED|ERROR)' $OUT/cuda-tests.log | head -n 40; tail -n 3 $OUT/cuda-tests.log
  exit \$rc"
# The caching allocator would hide out-of-bounds accesses inside its blocks from memcheck.
step memcheck 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
  --error-exitcode 1 $PY tests/sanitizer_cases.py
step racecheck 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck \
  --error-exitcode 1 $PY tests/sanitizer_cases.py
for name in "${!BG_PID[@]}"; do bg_wait "$name"; done
# The results page's two benchmarks (bench/results/<gpu>/), at their default CUDA settings:
# bf16, 16 heads of 128, 16k tokens per batch, seqlen 1k-16k, forward and forward+backward,
# causal and not; decode at issue 33's targets (B 1 and 32, Sq 1 and 4, Sk 8k and 32k, pages of
# 16; the CUDA default grid grew past this step's time with B 4/128 and pages 1/64). They run first among the
# benchmarks; the trimmed ones below measure subsets of them, and the model's comparison reads
# dense.json too. A step cut by the deadline writes no JSON (GPU_CHECK_SKIP="results-dense
# results-decode" leaves them out of a rerun).
RESULTS=$OUT/results/$MODEL_GPU
mkdir -p "$RESULTS"
step results-dense 150 $PY -m flashattn.bench --device cuda --json "$RESULTS/dense.json"
step results-decode 150 $PY -m flashattn.bench decode --device cuda --batch-sizes 1,32 \
  --q-lens 1,4 --kv-lens 8192,32768 --json "$RESULTS/decode.json"
# Trimmed first benchmark: the model's shape (16k tokens, hidden 2048, N = 4096) for d = 128,
# 64, 256, forward and forward+backward, causal and not; N = 1024 too at d = 128.
step bench-d128 90 $PY -m flashattn.bench --device cuda --head-dim 128 --heads 16 \
  --seqlens 1024,4096 --repeats 5 --json "$OUT/bench-d128.json"
# Issue 12's decode target (B = 32, Sk >= 8k: >= 80% of the bandwidth), with B = 1 beside it:
# the GQA-packed decode path (cuda/gqa_decode.h) against every SDPA backend and FA2 if present.
step bench-decode 60 $PY -m flashattn.bench decode --device cuda --batch-sizes 1,32 \
  --kv-lens 8192,32768 --repeats 5 --json "$OUT/bench-decode.json"
# The same decode on the sm_90a forward (FLASHATTN_CUDA_HOPPER=1): GQA-packed decodes run the Hopper
# kernel since 2026-12-04 (docs/lab/2026-12-04-hopper-packed-gqa-decode.md owes this timing
# against the sm_80 path's bench-decode above).
step bench-decode-hopper 60 env FLASHATTN_CUDA_HOPPER=1 $PY -m flashattn.bench decode --device cuda \
  --batch-sizes 1,32 --kv-lens 8192,32768 --repeats 5 --json "$OUT/bench-decode-hopper.json"
# Issue 29's small problems, --quick (S 16, 64 at B 1): per-call µs of flash_attn_func and every
# SDPA backend, and each call's host time with the GPU kept busy (host_us): a few seconds.
step bench-small 45 $PY -m flashattn.bench small --device cuda --quick \
  --json "$OUT/bench-small.json"
# Nsight Compute on the model's d = 128 shape (tools/ncu_workload.py): the counters that
# tools/gpu_model.py counts on the shim (mma, ldmatrix, shared-memory wavefronts and bank
# conflicts, sectors), measured, plus each kernel's duration and throughput breakdown.
if command -v ncu >/dev/null; then
  step ncu 90 bash -c "ncu --clock-control none -f -o $OUT/ncu -c 5 \
    -k 'regex:fwd_kernel_16bit|bwd_dkdv_kernel_16bit|bwd_dq_kernel_16bit' \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section InstructionStats --section LaunchStats \
    --section Occupancy --section WarpStateStats $PY tools/ncu_workload.py \
    && ncu --import $OUT/ncu.ncu-rep --page details > $OUT/ncu_details.txt \
    && { ncu --import $OUT/ncu.ncu-rep --page raw --csv --print-metric-instances values \
           > $OUT/ncu_raw.csv || ncu --import $OUT/ncu.ncu-rep --page raw --csv > $OUT/ncu_raw.csv; }"
fi
step bench-d64 60 $PY -m flashattn.bench --device cuda --head-dim 64 --heads 32 --seqlens 4096 \
  --repeats 5 --json "$OUT/bench-d64.json"
step bench-d256 60 $PY -m flashattn.bench --device cuda --head-dim 256 --heads 8 --seqlens 4096 \
  --repeats 5 --json "$OUT/bench-d256.json"
