"""Misuse the shim must report as cudasim::SimError naming the kernel's call site, and recover
from: every case also runs a correct kernel afterwards (tests/cudasim/selftest/misuse_test.cpp)."""
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import SELFTEST_DIR, program, run, source_line  # noqa: E402

SOURCE = os.path.join(SELFTEST_DIR, "misuse_test.cpp")
SIM_ERROR = 3


def site(marker):
    return f"misuse_test.cpp:{source_line(SOURCE, marker)}"


# case -> (regex the message must match, call-site markers it must name)
CASES = {
    "divergent_barrier": (r"divergent __syncthreads .*threads 0-31 .*threads 32-63",
                          ["divergent_first", "divergent_second"]),
    "deadlock": (r"deadlock in kernel .*shuffle_meets_barrier.*thread 31 waits in __syncthreads",
                 ["deadlock_barrier", "deadlock_shuffle"]),
    "pending_cp_async": (r"cp\.async issued here is still pending when the thread returns",
                         ["pending_copy"]),
    "pending_cp_async_behind_empty_group": (
        r"cp\.async issued here is still pending when the thread returns .*"
        r"\[kernel misuse::cp_async_pending_behind_empty_group\(uint4 const\*\)",
        ["pending_behind_empty"]),
    "ldmatrix_misaligned": (r"ldmatrix\.x4: lane 5's row address .* not 16-byte aligned",
                            ["misaligned"]),
    "red_v2_misaligned": (r"red\.global\.add\.v2\.f32: address .* is not 8-byte aligned",
                          ["red_misaligned"]),
    "ldmatrix_not_shared": (r"ldmatrix\.x1: lane 0's row address .* inside dynamic shared memory",
                            ["not_shared"]),
    "shuffle_excludes_caller": (r"mask 0xfffffffe, which does not include the calling lane 0",
                                ["excludes_caller"]),
    "shuffle_outside_mask": (r"lane 0 reads lane 16, which is not in mask 0xffff", ["outside_mask"]),
    "shuffle_returned_lanes": (r"thread returns while lanes 0-15 wait for it in __shfl_xor_sync",
                               ["returned_lanes"]),
    "mma_partial_warp": (r"warp-wide \.aligned instruction, but this warp has only 16 threads",
                         ["partial_warp"]),
    "mixed_collectives": (r"lanes of one warp meet different collectives: .*__syncwarp.*__shfl_xor_sync",
                          ["mixed_shuffle", "mixed_syncwarp"]),
    "cp_async_bad_size": (r"src_bytes = 17 is outside \[0, 16\]", ["bad_size"]),
    "smem_over_48k_without_opt_in": (r"65536 bytes of dynamic shared memory exceed .* 49152", []),
    "smem_opt_in_above_227k": (r"exceeds the 227 KB", []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_misuse_is_reported_with_call_site(case):
    pattern, markers = CASES[case]
    out = run(program("misuse_test"), case)
    assert out.returncode == SIM_ERROR, out.stdout + out.stderr
    message = out.stdout.splitlines()[0]
    assert re.search(pattern, message), message
    for marker in markers:
        assert site(marker) in message, f"{site(marker)} not named in: {message}"
    assert "recovered" in out.stdout


def test_opted_in_large_smem_launches():
    out = run(program("misuse_test"), "smem_over_48k_with_opt_in")
    assert out.returncode == 0 and "no error" in out.stdout, out.stdout + out.stderr


def test_only_empty_cp_async_groups_at_exit_are_legal():
    """Empty commit groups carry no copy: a thread may return with them outstanding."""
    out = run(program("misuse_test"), "only_empty_cp_async_groups_pending")
    assert out.returncode == 0 and "no error" in out.stdout, out.stdout + out.stderr


def test_bad_schedule_is_reported():
    out = run(program("misuse_test"), "smem_over_48k_with_opt_in", schedule="sideways")
    assert "bad schedule 'sideways'" in out.stdout + out.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_paths_are_clean_under_asan(case):
    """Threads abandoned by an error never return: the shim must leave nothing on their stacks
    that owns memory, or every failing sim test would also report leaks."""
    out = run(program("misuse_test", sanitize=True), case)
    assert out.returncode == SIM_ERROR, out.stdout + out.stderr
    assert "Sanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr
