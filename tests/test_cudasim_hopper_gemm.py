"""The warp-specialized TMA -> mbarrier -> wgmma GEMM test kernel
(tests/cudasim/selftest/hopper_gemm_kernel.cuh, run by selftest/hopper_gemm_test.cpp) on the shim:
exact on integer-valued inputs under every schedule and copy completion, ragged M/N/K included,
and the planted bugs in it reported as named errors. Its GPU side (tests/cudasim/hopper_gemm.py)
must keep compiling for sm_90a, and the wgmma wrappers must fail clearly in a plain sm_90 pass."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import (CORRECT, SELFTEST_DIR, SIM_ERROR, named_error, program, run,  # noqa: E402
                      site_of)
import hopper_gemm  # noqa: E402

KERNEL = os.path.join(SELFTEST_DIR, "hopper_gemm_kernel.cuh")
SCHEDULES = ["forward", "reverse", "random:1", "random:2"]
COMPLETIONS = ["lazy", "eager", "random"]
SHAPES = ["bf16_k_2c", "bf16_k_2c_ragged", "f16_k_1c_ragged", "bf16_mn_2c_ragged", "f16_mn_1c",
          "e4m3_k_2c", "e4m3_k_2c_ragged", "e4m3_k_1c_ragged"]


def site(marker):
    return site_of(KERNEL, marker)


def run_case(case, schedule, completion):
    return run(program("hopper_gemm_test"), case, schedule=schedule, completion=completion)


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", SHAPES)
def test_gemm_is_exact(case, schedule, completion):
    out = run_case(case, schedule, completion)
    assert out.returncode == CORRECT, out.stdout + out.stderr
    assert out.stdout.startswith("ok: "), out.stdout


@pytest.mark.parametrize("completion", ["eager", "random"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stage_released_before_the_wgmma_wait_is_caught(schedule, completion):
    """A consumer releases a stage right after issuing the MMAs that read it, not after the
    wait_group that retires them: the producer's load of the step after next lands in it while
    they are in flight. Eagerly (and at random, for these seeds) it lands at once; lazily it lands
    only once the wait has passed, harmless, so lazy completion may pass, never silently wrong."""
    out = run_case("early_release", schedule, completion)
    message = named_error(
        out, r"wgmma\.mma_async issued here reads operand [AB] at smem\+0x[0-9a-f]+, which "
             r"changed \(last written at \S+ \(an async-proxy copy\)\) before the "
             r"wgmma\.wait_group at \S+ retired it")
    assert site("wgmma") in message, message
    assert site("wait_previous") in message or site("wait_last") in message, message
    assert site("load_a") in message or site("load_b") in message, message
    lazy = run_case("early_release", schedule, "lazy")
    assert lazy.returncode in (CORRECT, SIM_ERROR), lazy.stdout + lazy.stderr


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_missing_expect_tx_is_caught(schedule, completion):
    """Without expect_tx the producer's arrival completes the phase at once: a copy landing later
    underflows the next phase's transaction count (eager, random), or, if none lands before
    the block ends (lazy: the consumers never block on a copy), it is still in flight then."""
    out = run_case("no_expect_tx", schedule, completion)
    message = named_error(
        out, r"mbarrier: transaction-byte underflow: the copy issued here lands \d+ bytes "
             r"on the mbarrier at smem\+0x[0-9a-f]+ in phase \d+, which expects only 0 "
             r"\(a missing or short expect_tx|cp\.async\.bulk\.tensor issued here is still "
             r"in flight when every thread of the block has returned")
    if completion == "lazy":
        assert "still in flight" in message, message
    else:
        assert "transaction-byte underflow" in message, message
    assert site("load_a") in message or site("load_b") in message, message


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_missing_proxy_fence_before_the_tma_store_is_caught(schedule, completion):
    out = run_case("no_proxy_fence", schedule, completion)
    message = named_error(
        out, r"reads smem\+0x[0-9a-f]+ through the async proxy, but thread \d+ \(warp \d+ "
             r"lane \d+\) stored it at \S+ through the generic proxy and has not executed "
             r"fence\.proxy\.async since")
    assert site("store_c") in message and site("stage_c") in message, message


@pytest.mark.skipif(hopper_gemm.nvcc_path() is None, reason="nvcc not found")
def test_gpu_runner_compiles_for_sm90a():
    out = subprocess.run([sys.executable, hopper_gemm.__file__, "--compile-only"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "hopper_gemm_gpu_sm90a" in out.stdout


@pytest.mark.skipif(hopper_gemm.nvcc_path() is None, reason="nvcc not found")
def test_wgmma_in_a_plain_sm90_pass_fails_clearly(tmp_path):
    """ptx_sm90_mma.cuh compiles in a plain sm_90 device pass; a kernel that calls wgmma or
    setmaxnreg there fails at compile time with a message naming sm_90a, not in ptxas."""
    source = tmp_path / "plain_sm90.cu"
    source.write_text('#include "cuda/ptx.cuh"\n'
                      "__global__ void uses_nothing(float* out) { out[0] = 1.f; }\n"
                      "#ifdef CALL_WGMMA\n"
                      "__global__ void calls_wgmma() { flashattn::ptx::wgmma_fence(); }\n"
                      "#endif\n")
    base = [hopper_gemm.nvcc_path(), "-arch=sm_90", "-std=c++17", "-I",
            os.path.join(hopper_gemm.build.REPO_ROOT, "csrc"), "-c", str(source), "-o",
            str(tmp_path / "out.o")]
    plain = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    calls = subprocess.run(base + ["-DCALL_WGMMA"], capture_output=True, text=True, timeout=300)
    assert calls.returncode != 0
    assert "arch-specific sm_90a device pass" in calls.stderr, calls.stderr
