#!/usr/bin/env bash
# The whole GPU pass in one call, for a lent GPU machine (15 minutes of device time in all):
# build for the chip in front of us, the primitive layout check, the CUDA tests,
# compute-sanitizer memcheck and racecheck, and the benchmark against every SDPA backend.
#
#   bash bench/gpu_check.sh          logs and results go to $OUT (default ./gpu-out)
#
# Every step runs even if an earlier one failed (a partial run is a result too); the summary
# table comes last because the device tool returns only the tail of the output.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ARCH=${FLASHATTN_CUDA_ARCHS:-90}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
exec > >(tee "$OUT/gpu_check.log") 2>&1

summary=()
step() {
  local name=$1 start result
  shift
  printf '\n== %s: %s\n' "$name" "$*"
  start=$(date +%s)
  if "$@"; then result=PASS; else result="FAIL (exit $?)"; fi
  summary+=("$(printf '%-12s %-16s %4d s' "$name" "$result" $(( $(date +%s) - start )))")
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

step build env FLASHATTN_CUDA=1 FLASHATTN_CUDA_ARCHS="$ARCH" MAX_JOBS="$(nproc)" \
  $PY setup.py build_ext --inplace
step layout $PY tests/cudasim/layout_check.py --arch "$ARCH"
step cuda-tests timeout 300 $PY -m pytest tests -q -x -k "cuda and not sim" -p no:cacheprovider \
  --junitxml "$OUT/cuda-tests.xml"
step memcheck timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 \
  $PY bench/sanitizer_cases.py
step racecheck timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 \
  $PY bench/sanitizer_cases.py
step bench timeout 240 $PY -m flashattn.bench --device cuda --json "$OUT/bench.json" \
  --plot "$OUT/bench.png"

printf '\n== summary (%s)\n' "$(date -u)"
printf '%s\n' "${summary[@]}"
