#!/usr/bin/env bash
# The whole GPU pass in one device call (at most 10 minutes; 15 minutes of device time in all):
# build for the chip in front of us (the primitive layout check runs meanwhile), the CUDA tests,
# compute-sanitizer memcheck and racecheck, and a trimmed benchmark against every SDPA backend,
# each measured figure printed next to bench/gpu_model.py's prediction for it, and a decoding
# step's (flash_attn_with_kvcache) KV bandwidth.
#
#   bash bench/gpu_check.sh          logs and results go to $OUT (default ./gpu-out)
#
# GPU_CHECK_DEADLINE_S (default 540) bounds the whole script, so a 600 s call returns with time
# to spare: each step runs under `timeout`, given what its cap allows of the time left (less
# SUMMARY_RESERVE_S), and a step with under 10 s left is skipped. Every step runs even if an
# earlier one failed (a partial run is a result too). The summary -- steps, then model against
# measurement -- is printed by an EXIT trap, whatever happens (a failure, a timeout, SIGTERM),
# and last, because the device tool returns only the tail of the output.
#
# Checked here, before any GPU (2026-11-30, csrc of branch gpu-model): every csrc source compiles
# against the GPU box's torch 2.11.0+cu130 headers at -std=c++17, which its cpp_extension uses
# (scripts/compile_check_torch.py --torch 2.11.0: g++ -fsyntax-only, nvcc -cuda front end).
# The model's predictions come from the snapshot bench/gpu_model.json (rerun bench/gpu_model.py
# after kernel changes; --compare says when the snapshot's csrc differs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ARCH=${FLASHATTN_CUDA_ARCHS:-90}
DEADLINE_S=${GPU_CHECK_DEADLINE_S:-540}
SUMMARY_RESERVE_S=15
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
exec > >(tee "$OUT/gpu_check.log") 2>&1

summary=()
failed=0
left() { echo $(( START + DEADLINE_S - SUMMARY_RESERVE_S - $(date +%s) )); }

record() {  # name result seconds
  summary+=("$(printf '%-12s %-22s %4d s' "$1" "$2" "$3")")
  [[ $2 == PASS ]] || failed=$(( failed + 1 ))
}

# step NAME CAP_S CMD...: CMD under timeout min(CAP_S, time left); PASS, FAIL or TIMEOUT.
step() {
  local name=$1 cap=$2 limit start rc
  shift 2
  limit=$(left)
  (( cap < limit )) && limit=$cap
  if (( limit < 10 )); then
    record "$name" "SKIPPED (deadline)" 0
    return
  fi
  printf '\n== %s (at most %d s): %s\n' "$name" "$limit" "$*"
  start=$(date +%s)
  # In the background, so that a signal to this script is handled at once (bash runs traps
  # only between foreground commands); timeout leads its own process group.
  timeout --kill-after=10 "$limit" "$@" &
  STEP_PID=$! STEP_NAME=$name STEP_START=$start
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  case $rc in
    0) record "$name" PASS $(( $(date +%s) - start )) ;;
    124|137) record "$name" "TIMEOUT (${limit} s)" $(( $(date +%s) - start )) ;;
    *) record "$name" "FAIL (exit $rc)" $(( $(date +%s) - start )) ;;
  esac
}

stop_children() {
  if [[ -n ${STEP_PID:-} ]]; then
    kill -TERM -- "-$STEP_PID" 2>/dev/null
    record "$STEP_NAME" INTERRUPTED $(( $(date +%s) - STEP_START ))
  fi
  if [[ -n ${LAYOUT_PID:-} ]]; then
    [[ -s $OUT/layout.pid ]] && kill -TERM -- "-$(cat "$OUT/layout.pid")" 2>/dev/null
    kill -TERM "$LAYOUT_PID" 2>/dev/null
    record layout INTERRUPTED 0
  fi
  STEP_PID= LAYOUT_PID=
}

finish() {
  local rc=$?
  trap - EXIT INT TERM
  stop_children
  (( rc == 0 && failed > 0 )) && rc=1
  printf '\n== model vs measured (bench/gpu_model.json: modeled on %s)\n' "${MODEL_GPU:-h200}"
  $PY bench/gpu_model.py --compare "$OUT"/bench-*.json --model bench/gpu_model.json \
    --gpu "${MODEL_GPU:-h200}" 2>&1 || true
  printf '\n== summary (%s, %d s of %d)\n' "$(date -u)" $(( $(date +%s) - START )) "$DEADLINE_S"
  printf '%s\n' "${summary[@]}"
  (( failed )) && printf '%d step(s) did not pass\n' "$failed"
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
rm -f "$OUT/layout.rc" "$OUT/layout.pid"
(
  start=$(date +%s)
  timeout --kill-after=10 "$(( $(left) < 300 ? $(left) : 300 ))" \
    $PY tests/cudasim/layout_check.py --arch "$ARCH" >"$OUT/layout.log" 2>&1 &
  echo $! >"$OUT/layout.pid"
  wait $!
  echo "$? $(( $(date +%s) - start ))" >"$OUT/layout.rc"
) &
LAYOUT_PID=$!
STEP_PID=

# Not FLASHATTN_PTXAS_STRICT: a spill must not cost the whole run (ptxas warns in the log).
step build 330 bash -c "set -o pipefail; env FLASHATTN_CUDA=1 FLASHATTN_CUDA_ARCHS=$ARCH \
  MAX_JOBS=$(nproc) $PY setup.py build_ext --inplace 2>&1 | tee $OUT/build.log | tail -n 30"

printf '\n== layout (ran during the build): waiting\n'
wait "$LAYOUT_PID"
LAYOUT_PID=
cat "$OUT/layout.log"
read -r layout_rc layout_s <"$OUT/layout.rc" || { layout_rc=1; layout_s=0; }
case $layout_rc in
  0) record layout PASS "$layout_s" ;;
  124|137) record layout TIMEOUT "$layout_s" ;;
  *) record layout "FAIL (exit $layout_rc)" "$layout_s" ;;
esac

step cuda-tests 180 $PY -m pytest tests -q --maxfail=10 -k "cuda and not sim" -p no:cacheprovider \
  --junitxml "$OUT/cuda-tests.xml"
# The caching allocator would hide out-of-bounds accesses inside its blocks from memcheck.
step memcheck 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
  --error-exitcode 1 $PY bench/sanitizer_cases.py
step racecheck 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck \
  --error-exitcode 1 $PY bench/sanitizer_cases.py
# Trimmed first benchmark: the model's shape (16k tokens, hidden 2048, N = 4096) for d = 128,
# 64, 256, forward and forward+backward, causal and not; N = 1024 too at d = 128.
step bench-d128 90 $PY -m flashattn.bench --device cuda --head-dim 128 --heads 16 \
  --seqlens 1024,4096 --repeats 5 --json "$OUT/bench-d128.json"
# Issue 12's decode target (B = 32, Sk >= 8k: >= 80% of the bandwidth), with B = 1 beside it:
# the GQA-packed decode path (cuda/gqa_decode.h) against every SDPA backend and FA2 if present.
step bench-decode 60 $PY -m flashattn.bench --device cuda --decode --batch-sizes 1,32 \
  --kv-lens 8192,32768 --repeats 5 --json "$OUT/bench-decode.json"
step bench-d64 60 $PY -m flashattn.bench --device cuda --head-dim 64 --heads 32 --seqlens 4096 \
  --repeats 5 --json "$OUT/bench-d64.json"
step bench-d256 60 $PY -m flashattn.bench --device cuda --head-dim 256 --heads 8 --seqlens 4096 \
  --repeats 5 --json "$OUT/bench-d256.json"
