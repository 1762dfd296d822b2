#!/usr/bin/env bash
# Installs everything, builds flashattn once as a wheel, installs that wheel into a fresh venv
# and runs the test suite against the installed package, as a user would have it.
#
#   bash scripts/test.sh [pytest args...]      e.g.  bash scripts/test.sh -m slow
#
# PYTHON picks the interpreter (default python3). FLASHATTN_CUDA / FLASHATTN_CUDA_ARCHS /
# MAX_JOBS are passed to the build (see setup.py); the CUDA sources are compiled whenever a
# toolkit is found, even on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_VENV=.venv-build
TEST_VENV=.venv-test

step() { printf '\n== %s\n' "$*"; }

# A venv with torch takes ~5.5 GB, the build tree and the wheel ~2 GB: a fresh clone needs ~13 GB.
# A full disk otherwise surfaces as pip's "[Errno 28] No space left on device" mid-install.
venvs_to_make=0
for venv in "$BUILD_VENV" "$TEST_VENV"; do [ -x "$venv/bin/python" ] || venvs_to_make=$((venvs_to_make + 1)); done
NEED_GB=${FLASHATTN_TEST_NEED_GB:-$((2 + 6 * venvs_to_make))}
FREE_GB=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
if [ "$FREE_GB" -lt "$NEED_GB" ]; then
  echo "scripts/test.sh needs about $NEED_GB GB free under $(pwd) ($venvs_to_make new venv(s) with" \
       "torch, the build and the wheel); the disk has $FREE_GB GB free. Free some space first." >&2
  exit 1
fi

step "build environment ($BUILD_VENV)"
[ -x "$BUILD_VENV/bin/python" ] || "$PYTHON" -m venv "$BUILD_VENV"
"$BUILD_VENV/bin/python" -m pip install -q --upgrade pip
"$BUILD_VENV/bin/python" -m pip install -q "torch>=2.11,<2.15" ninja "setuptools>=77" wheel numpy
TORCH_VERSION=$("$BUILD_VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')

step "build the wheel (torch $TORCH_VERSION)"
# Spills or local memory in a CUDA kernel fail the build; ptxas reports feed the gates below.
export FLASHATTN_PTXAS_STRICT=${FLASHATTN_PTXAS_STRICT:-1}
rm -rf dist
start=$(date +%s)
mkdir -p build
if ! MAX_JOBS=${MAX_JOBS:-$(nproc)} "$BUILD_VENV/bin/python" -m pip wheel -v --no-build-isolation \
    --no-deps -w dist . >build/wheel.log 2>&1; then
  tail -n 60 build/wheel.log
  echo "wheel build failed; full log in build/wheel.log" >&2
  exit 1
fi
grep -E "flashattn: .* build of _C took" build/wheel.log || true
WHEEL=$(ls dist/flashattn-*.whl)
echo "built $WHEEL in $(( $(date +%s) - start )) s"

step "fresh test environment ($TEST_VENV) with the installed wheel"
rm -rf "$TEST_VENV"
"$PYTHON" -m venv "$TEST_VENV"
"$TEST_VENV/bin/python" -m pip install -q --upgrade pip
"$TEST_VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" ninja "setuptools>=77" numpy pytest pytest-xdist matplotlib "hypothesis>=6"
"$TEST_VENV/bin/python" -m pip install -q --no-deps "$WHEEL"

if grep -q "flashattn: CUDA build of _C" build/wheel.log; then
  step "CUDA gates on the built library (registers, SASS: HMMA/LDSM/LDGSTS, no local memory)"
  INSTALLED_LIB=$(ls "$TEST_VENV"/lib/python3*/site-packages/flashattn/_C*.so)
  "$BUILD_VENV/bin/python" .ci/cuda_gates.py --binary "$INSTALLED_LIB" | tee build/cuda_gates.log
  # The gates checked the sm_90a kernels this build compiled (no spills, local memory or stack,
  # every forward main loop): test_cudasim_hopper_build.py checks their log instead of compiling
  # one file again.
  if grep -Eq "the [1-9][0-9]* sm_90a kernels use" build/cuda_gates.log; then
    export FLASHATTN_SM90A_GATES_LOG="$PWD/build/cuda_gates.log"
  fi
fi

step "tests"
# One pytest worker per core, at most 8 (FLASHATTN_TEST_WORKERS overrides; 0 runs in one process):
# most of the suite's time is single-threaded (the shim's compiles and its warps, small shapes).
# Every worker takes the controller's seed (conftest.py), so a failure reproduces with it.
WORKERS=${FLASHATTN_TEST_WORKERS:-$(( $(nproc) < 8 ? $(nproc) : 8 ))}
# Run from tests/ so `import flashattn` can only find the installed wheel; conftest asserts it.
cd tests
FLASHATTN_TEST_INSTALLED=1 "../$TEST_VENV/bin/python" -m pytest -c ../pyproject.toml --rootdir .. \
  -n "$WORKERS" --durations=20 "$@"
