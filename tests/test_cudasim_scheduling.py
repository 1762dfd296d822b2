"""Schedules (CUDASIM_SCHEDULE and cudasim::set_schedule), built-in variables, static shared
memory, atomics and the f16/bf16 intrinsics kernels use (tests/cudasim/selftest/scheduling_test.cpp)."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
import build  # noqa: E402
from fixtures import SELFTEST_DIR, program, run  # noqa: E402

THREADS, BLOCKS = 64, 2
FORWARD = [(b, t) for b in range(BLOCKS) for t in range(THREADS)]


def first_run_orders(schedule, mode="order"):
    """One first-run order per line the program prints."""
    out = run(program("scheduling_test"), mode, schedule=schedule)
    assert out.returncode == 0, out.stdout + out.stderr
    return [[tuple(int(x) for x in pair.split(":")) for pair in line.split()]
            for line in out.stdout.splitlines()]


def first_run_order(schedule):
    (order,) = first_run_orders(schedule)
    return order


def test_forward_runs_blocks_warps_and_lanes_in_order():
    assert first_run_order("forward") == FORWARD


def test_default_schedule_is_forward():
    assert first_run_order(None) == FORWARD


def test_reverse_runs_everything_backwards():
    assert first_run_order("reverse") == FORWARD[::-1]


def test_random_is_reproducible_and_seeded():
    first = first_run_order("random:1")
    assert first == first_run_order("random:1")
    assert first != first_run_order("random:2")
    assert sorted(first) == FORWARD and first not in (FORWARD, FORWARD[::-1])


def test_warps_run_one_at_a_time():
    """Between barriers a warp runs until every lane blocks or returns: no interleaving."""
    order = first_run_order("random:3")
    warps = [(b, t // 32) for b, t in order]
    runs = [w for i, w in enumerate(warps) if i == 0 or warps[i - 1] != w]
    assert len(runs) == len(set(runs)) == BLOCKS * THREADS // 32


def test_set_schedule_overrides_environment_until_cleared():
    overridden, cleared = first_run_orders("forward", mode="api_order")
    assert overridden == FORWARD[::-1]
    assert cleared == FORWARD


def test_schedule_names_round_trip():
    out = run(program("scheduling_test"), "names")
    assert out.stdout.split() == ["forward", "reverse", "random:0", "random:18446744073709551615"]


@pytest.mark.parametrize("env, expected", [(None, 2), ("3", 3), ("1", 1)])
def test_sm_count_from_environment_default_two_and_overridable(monkeypatch, env, expected):
    """cudasim::sm_count(): CUDASIM_SM_COUNT, else 2 (persistent launches size their grids by it);
    set_sm_count overrides until clear_sm_count, and refuses a count below 1."""
    if env is None:
        monkeypatch.delenv("CUDASIM_SM_COUNT", raising=False)
    else:
        monkeypatch.setenv("CUDASIM_SM_COUNT", env)
    out = run(program("scheduling_test"), "sm_count")
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout.splitlines()[0].split() == [str(expected), "5", str(expected)], out.stdout
    assert "set_sm_count(0)" in out.stdout, out.stdout


@pytest.mark.parametrize("env", ["0", "-1", "x", "1234567"])
def test_sm_count_refuses_a_bad_environment(monkeypatch, env):
    monkeypatch.setenv("CUDASIM_SM_COUNT", env)
    out = run(program("scheduling_test"), "sm_count")
    assert out.returncode == 3 and "bad CUDASIM_SM_COUNT '%s'" % env in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("schedule", ["forward", "random:4"])
def test_builtins_atomics_and_conversions(schedule):
    out = run(program("scheduling_test"), "builtins", schedule=schedule)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stdout + out.stderr


def test_kernel_source_compiles_as_cxx20():
    """torch 2.14 extensions compile as C++20; the shim header and kernel idioms must too."""
    program("scheduling_test")  # skips where the toolchain is missing
    source = os.path.join(SELFTEST_DIR, "scheduling_test.cpp")
    out = subprocess.run([build.CXX, *build.compile_flags(cxx_std="c++20"), "-Werror",
                          "-fsyntax-only", source], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
