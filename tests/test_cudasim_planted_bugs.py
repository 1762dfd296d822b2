"""Planted bugs in an FA2-style kernel (tests/cudasim/selftest/tile_gemm_kernel.cuh):
cp.async -> ldmatrix -> mma -> shuffle row max -> P*V through ldmatrix.trans. The correct kernel
must match the reference exactly under every schedule; each bug must be reported."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import program, run  # noqa: E402

SCHEDULES = ["forward", "reverse", "random:1", "random:2"]
MATCHES, WRONG, SIM_ERROR = 0, 1, 3
FULL_TILE, RAGGED_TILE = 32, 29  # rows; 29 exercises the zero-filled tail


@pytest.mark.parametrize("rows", [FULL_TILE, RAGGED_TILE])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_correct_kernel_matches_reference(schedule, rows):
    out = run(program("tile_gemm_test"), "correct", str(rows), schedule=schedule)
    assert out.returncode == MATCHES, out.stdout + out.stderr


@pytest.mark.parametrize("bug", ["missing_sync_before_reuse", "missing_sync_before_store",
                                 "missing_wait", "wrong_shuffle_xor", "missing_trans"])
def test_planted_bug_is_caught(bug):
    outcomes = {s: run(program("tile_gemm_test"), bug, str(RAGGED_TILE), schedule=s)
                for s in SCHEDULES}
    caught = [s for s, out in outcomes.items() if out.returncode in (WRONG, SIM_ERROR)]
    assert caught, {s: out.stdout + out.stderr for s, out in outcomes.items()}


def test_missing_barrier_depends_on_schedule():
    """A write-after-read race: warp 0 refills the buffer warp 1 still has to read. Running warp 0
    first exposes it, running warp 1 first hides it, which is why CI must run several orders."""
    exe = program("tile_gemm_test")
    forward = run(exe, "missing_sync_before_reuse", str(FULL_TILE), schedule="forward")
    reverse = run(exe, "missing_sync_before_reuse", str(FULL_TILE), schedule="reverse")
    assert forward.returncode == WRONG, forward.stdout + forward.stderr
    assert reverse.returncode == MATCHES, reverse.stdout + reverse.stderr


def test_tail_overread_is_invisible_without_asan():
    out = run(program("tile_gemm_test"), "tail_overread", str(RAGGED_TILE))
    assert out.returncode == MATCHES, out.stdout + out.stderr


def test_correct_kernel_is_clean_under_asan():
    """Also proves the fiber switches are annotated: unannotated, ASan reports stack errors."""
    out = run(program("tile_gemm_test", sanitize=True), "correct", str(RAGGED_TILE),
              schedule="random:5")
    assert out.returncode == MATCHES, out.stdout + out.stderr
    assert "ERROR: AddressSanitizer" not in out.stderr
    assert "runtime error" not in out.stderr


def test_tail_overread_is_caught_by_asan():
    out = run(program("tile_gemm_test", sanitize=True), "tail_overread", str(RAGGED_TILE))
    assert out.returncode != MATCHES
    assert "heap-buffer-overflow" in out.stderr
    assert "cp_async_16" in out.stderr and "tile_gemm_kernel" in out.stderr


def test_shared_memory_overrun_is_caught_by_asan():
    """Dynamic shared memory is an exact-size heap block, so one int past its end is reported."""
    out = run(program("misuse_test", sanitize=True), "smem_overrun")
    assert "heap-buffer-overflow" in out.stderr, out.stdout + out.stderr
    assert "smem_overrun" in out.stderr
