"""Builds and runs the shim's self-test programs for tests/test_cudasim_*.py.

Programs are compiled once per process and cached on disk (build/cudasim, keyed by
the hash of sources and flags), so a rerun only relinks."""
import os
import re
import shutil
import subprocess

import pytest

import build

BUILD_DIR = build.DEFAULT_BUILD_DIR
SELFTEST_DIR = os.path.join(build.SHIM_DIR, "selftest")
RUN_TIMEOUT_S = 60
# A self-test program's exit status: its checks held, a result was wrong, the shim named an error.
CORRECT, WRONG, SIM_ERROR = 0, 1, 3

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


def assert_every_line_ok(out):
    """A self-test run passed: it exited with 0 and printed only "ok: " lines, at least one."""
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines and all(line.startswith("ok: ") for line in lines), out.stdout


def planted_header(tmp_path, path, edits):
    """Writes csrc/<path> with each (old, new) edit applied to tmp_path/<path> and returns the
    compiler flags that make a self-test include it instead of the real header (-iquote
    directories are searched first for quoted includes). Each old text must stand in the header
    exactly once, so a planted bug cannot silently stop planting after the kernel changes."""
    with open(os.path.join(build.REPO_ROOT, "csrc", path)) as f:
        source = f.read()
    for old, new in edits:
        assert source.count(old) == 1, f"the planted bug's text {old!r} is not in csrc/{path} once"
        source = source.replace(old, new)
    os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
    (tmp_path / path).write_text(source)
    return ["-iquote", str(tmp_path)]


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


def site_of(path, marker):
    """`<file>:<line>` of the `// SITE:marker` line of a self-test source, as the shim's messages
    name it."""
    return f"{os.path.basename(path)}:{source_line(path, marker)}"


def first_line(out):
    """The first line a program printed (the shim's error message), or its stderr."""
    return out.stdout.splitlines()[0] if out.stdout else out.stderr


def named_error(out, pattern, sites=()):
    """The shim's message, after asserting that the run stopped on a named error whose message
    matches the regex `pattern` and names every one of `sites`."""
    assert out.returncode == SIM_ERROR, out.stdout + out.stderr
    message = first_line(out)
    assert re.search(pattern, message), message
    for site in sites:
        assert site in message, f"{site} not named in: {message}"
    return message
