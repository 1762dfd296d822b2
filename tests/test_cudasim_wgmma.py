"""wgmma, stmatrix, setmaxnreg and fence.proxy.async on the shim
(tests/cudasim/selftest/wgmma_test.cpp): every layout case of selftest/sm90_wgmma_cases.h (the
cases the GPU layout check runs) matches its ISA reference under every schedule, and each
planted bug is reported as its named error or shows as NaN in the output."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import (CORRECT, SELFTEST_DIR, SIM_ERROR, WRONG, named_error,  # noqa: E402
                      program, run, site_of)

SOURCE = os.path.join(SELFTEST_DIR, "wgmma_test.cpp")
SCHEDULES = ["forward", "reverse", "random:1"]
COMPLETIONS = ["lazy", "eager", "random"]


def site(marker):
    return site_of(SOURCE, marker)


def run_case(case, schedule="forward", sanitize=False, completion=None):
    return run(program("wgmma_test", sanitize=sanitize), case, schedule=schedule,
               completion=completion)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", ["layouts", "pipeline", "setmaxnreg", "cp_async_fenced"])
def test_correct_kernels_pass(case, schedule):
    out = run_case(case, schedule)
    assert out.returncode == CORRECT, out.stdout + out.stderr


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_tma_ring_feeding_wgmma_passes(schedule, completion):
    out = run_case("tma_ring", schedule, completion=completion)
    assert out.returncode == CORRECT, out.stdout + out.stderr


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stage_released_before_the_wait_is_caught_when_the_copy_lands(schedule):
    """Eagerly, the producer's next tensor copy lands in the released stage before the consumers'
    wait_group retires the MMA reading it; lazily it lands after, which is harmless."""
    out = run_case("tma_ring_early_release", schedule, completion="eager")
    message = named_error(
        out, r"wgmma\.mma_async issued here reads operand B at smem\+0x[0-9a-f]+, which "
             r"changed (\(last written at \S+ \(an async-proxy copy\)\) )?before the "
             r"wgmma\.wait_group at \S+ retired it")
    assert site("ring_wgmma") in message and site("ring_wait") in message, message
    for completion in ("lazy", "random"):
        out = run_case("tma_ring_early_release", schedule, completion=completion)
        assert out.returncode in (CORRECT, SIM_ERROR), out.stdout + out.stderr


def test_every_layout_case_runs():
    out = run_case("layouts")
    assert "94 cases, 0 failed" in out.stdout, out.stdout


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_reading_accumulators_before_the_wait_reads_nan(schedule):
    out = run_case("read_before_wait", schedule)
    assert out.returncode == WRONG, out.stdout + out.stderr
    assert "4096 of 4096 outputs differ, 4096 are NaN; 0 accumulators NaN after the wait" in out.stdout


@pytest.mark.parametrize("case,pattern,markers", [
    ("no_wait", r"wgmma\.mma_async issued here is still in flight when the thread returns "
                r"\(missing wgmma\.commit_group / wgmma\.wait_group\)", ["wgmma"]),
    ("early_release", r"wgmma\.mma_async issued here reads operand B at smem\+0x[0-9a-f]+, which "
                      r"changed \(last written at \S+ \(a store by thread 1[2-5]\d\)\) before the "
                      r"wgmma\.wait_group at \S+ retired it: its shared memory was released or "
                      r"overwritten too early", ["wgmma", "producer_overwrite", "wait"]),
    ("missing_proxy_fence", r"wgmma\.mma_async reads smem\+0x[0-9a-f]+ through the async proxy, but "
                            r"thread \d+ \(warp \d lane \d+\) stored it at \S+ through the generic "
                            r"proxy and has not executed fence\.proxy\.async since",
     ["wgmma", "stage_a"]),
    ("cp_async_no_fence", r"wgmma\.mma_async reads smem\+0x[0-9a-f]+ through the async proxy, but "
                          r"thread \d+ \(warp \d lane \d+\) stored it at \S+ through the generic "
                          r"proxy and has not executed fence\.proxy\.async since",
     ["wgmma", "cp_async_b"]),
    ("stmatrix_no_fence", r"wgmma\.mma_async reads smem\+0x[0-9a-f]+ through the async proxy, but "
                          r"thread \d+ \(warp 0 lane \d+\) stored it at \S+ through the generic "
                          r"proxy and has not executed fence\.proxy\.async since",
     ["wgmma", "stmatrix_b"]),
    ("missing_wgmma_fence", r"thread \d+ of the warpgroup has executed no wgmma\.fence since the "
                            r"kernel began or since its last wgmma\.wait_group", ["wgmma"]),
    ("writes_accumulator", r"wgmma\.wait_group: accumulator 3 of the wgmma\.mma_async issued at "
                           r"\S+ was written while the MMA was in flight", ["wait", "wgmma"]),
    ("dead_frame", r"the accumulators of the wgmma\.mma_async issued here lived in a function "
                   r"that returned before the wgmma\.wait_group at \S+ retired it",
     ["dead_frame_wgmma", "wait"]),
    ("setmaxnreg_over_budget", r"setmaxnreg\.(inc 240|dec 40): the warpgroups ask for 40, 240, "
                               r"240, 240 registers per thread, 97280 in all, more than the "
                               r"65536-register file", []),
    ("setmaxnreg_split_sites", r"threads of one warpgroup meet different collectives: this thread "
                               r"calls setmaxnreg\.dec while 64 threads of warpgroup 0 wait in "
                               r"setmaxnreg\.dec at ", ["dec", "dec_other_half"]),
    ("setmaxnreg_bad_count", r"setmaxnreg\.inc 20: the count must be a multiple of 8 from 24 to "
                             r"256", ["bad_count"]),
    ("stmatrix_misaligned", r"stmatrix\.x2: lane 9's row address 0x[0-9a-f]+ is not 16-byte "
                            r"aligned", ["stmatrix_misaligned"]),
    ("descriptor_outside_smem", r"wgmma\.mma_async: the descriptor of A \(0x[0-9a-f]+\) reaches "
                                r"smem\+0x[0-9a-f]+ for element \(\d+, \d+\), outside the 512 bytes "
                                r"of dynamic shared memory", ["outside"]),
])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_misuse_is_named(case, pattern, markers, schedule):
    out = run_case(case, schedule)
    named_error(out, pattern, [site(marker) for marker in markers])


def test_counters():
    out = run_case("counters")
    assert out.returncode == CORRECT, out.stdout + out.stderr
    assert ('"wgmma": {"instructions": 2, "by_shape": {"m64n8k16.f16": 1, "m64n64k16.bf16": 1}, '
            '"a_from_registers": 1, "macs": 73728, "fence": 1, "commit_group": 1, "wait_group": 1}, '
            '"setmaxnreg": {"inc": 1, "dec": 0}, "fence_proxy_async_threads": 128') in out.stdout


@pytest.mark.parametrize("case", ["layouts", "pipeline", "early_release", "no_wait", "dead_frame"])
def test_clean_under_asan(case):
    """Threads abandoned by an error own nothing; MMAs in flight are the block's, not theirs."""
    out = run_case(case, "random:7", sanitize=True)
    assert out.returncode in (CORRECT, SIM_ERROR), out.stdout + out.stderr
    assert "Sanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr
