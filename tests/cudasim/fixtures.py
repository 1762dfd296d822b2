"""Builds and runs the shim's self-test programs for tests/test_cudasim_*.py.

Programs are compiled once per process and cached on disk (build/cudasim, keyed by
the hash of sources and flags), so a rerun only relinks."""
import os
import shutil
import subprocess

import pytest

import build

BUILD_DIR = build.DEFAULT_BUILD_DIR
SELFTEST_DIR = os.path.join(build.SHIM_DIR, "selftest")
RUN_TIMEOUT_S = 60

_built = {}


def program(name, sanitize=False):
    """Path of selftest/<name>.cpp built against the shim; skips the test if it can't be built."""
    key = (name, sanitize)
    if key not in _built:
        if shutil.which(build.CXX) is None:
            pytest.skip(f"{build.CXX} not found")
        if build.cuda_include_dir() is None:
            pytest.skip("no cuda_fp16.h / vector_types.h (set CUDA_HOME)")
        if sanitize and not build.sanitizer_available():
            pytest.skip("g++ cannot link -fsanitize=address,undefined here")
        _built[key] = build.build_program([os.path.join(SELFTEST_DIR, name + ".cpp")], name,
                                          BUILD_DIR, sanitize=sanitize)
    return _built[key]


def run(exe, *args, schedule=None, completion=None, timeout=RUN_TIMEOUT_S):
    """Runs a self-test program under a schedule and a copy completion (the shim's defaults
    where None), whatever the calling environment sets."""
    env = dict(os.environ)
    for name, value in (("CUDASIM_SCHEDULE", schedule), ("CUDASIM_COPY_COMPLETION", completion)):
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=timeout)


def source_line(path, marker):
    """Line number of the line carrying `// SITE:marker` in a self-test source."""
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if line.rstrip().endswith("// SITE:" + marker):
                return number
    raise LookupError(f"no // SITE:{marker} in {path}")
