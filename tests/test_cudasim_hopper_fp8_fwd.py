"""The sm_90a FP8 (e4m3) forward at d = 128 (csrc/cuda/hopper/, V^T written by the producer,
fwd_sm90_transpose_v.cuh) on the shim: against float64 attention on the dequantized inputs with
P rounded to e4m3 as the kernel rounds it (selftest/hopper_fp8_fwd_test.cpp), no mask and causal
(both alignments), GQA, descales, seqused_k with NaN V rows past it, seqused_q (O stored from
registers in bf16), awkward Sq / Sk both ways, under every schedule and copy completion; and
planted bugs in the transpose, its synchronization and the descale, each of which the test
must catch. Its GPU side
(tests/cudasim/hopper_fp8_fwd.py) must keep compiling for sm_90a with no spills."""
import os
import re
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
import build  # noqa: E402
from fixtures import SELFTEST_DIR, assert_every_line_ok, planted_header, program, run  # noqa: E402
import hopper_gemm  # noqa: E402

SCHEDULES = ["forward", "reverse", "random:1", "random:2"]
COMPLETIONS = ["lazy", "eager", "random"]
CASES = ["e4m3_d128", "e4m3_d128_sizes", "e4m3_d128_causal", "e4m3_d128_causal_top_left",
         "e4m3_d128_seqused_k", "e4m3_d128_causal_seqused_k", "e4m3_d128_seqused_q",
         "e4m3_d128_causal_seqused_q"]
SOURCE = os.path.join(SELFTEST_DIR, "hopper_fp8_fwd_test.cpp")


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", CASES)
def test_fp8_forward_matches_float64(case, schedule, completion):
    out = run(program("hopper_fp8_fwd_test"), case, schedule=schedule, completion=completion)
    assert_every_line_ok(out)


@pytest.mark.parametrize("case", ["e4m3_d128", "e4m3_d128_causal_seqused_k", "e4m3_d128_seqused_q"])
def test_fp8_forward_is_clean_under_asan(case):
    """The transpose's shared-memory words, the tail zeroing and the stores from registers stay in
    bounds (ASan and UBSan over the kernel and the shim)."""
    out = run(program("hopper_fp8_fwd_test", sanitize=True), case, schedule="random:1",
              completion="random", timeout=600)
    assert_every_line_ok(out)
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr


# name -> (header under csrc/, text, planted text, what the failing run prints)
PLANTED = {
    # V^T's columns in key order: P's registers then meet the wrong keys.
    "identity_key_order": ("cuda/hopper/fwd_sm90_transpose_v.cuh",
                           "return 32 * step + 16 * half + 2 * q + e % 2 + 8 * (e / 2);",
                           "return 32 * step + 16 * half + 4 * q + e;", r"WRONG:"),
    # wgmma reads V^T through the async proxy: the shim names the missing fence.
    "no_proxy_fence": ("cuda/hopper/fwd_sm90_kernel.cuh",
                       "          fence_proxy_async_shared_cta();  // the consumers' wgmma reads V^T",
                       "          // (fence planted away)", r"SimError: .*(proxy|fence)"),
    # V's rows past seqused_k (NaN here) transposed as they are.
    "no_tail_zeroing": ("cuda/hopper/fwd_sm90_transpose_v.cuh", "word[e] = key < key_limit",
                        "word[e] = key < 1 << 30", r"WRONG:.*[1-9][0-9]* non-finite"),
    # v_descale left out of the epilogue.
    "no_v_descale": ("cuda/hopper/fwd_sm90_kernel.cuh", "inv_l[0] *= v_descale, inv_l[1] *= v_descale;",
                     "(void)v_descale;", r"WRONG:.*descale"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, tmp_path):
    """The self-test built against a copy of one kernel header with the bug planted (found first
    through -iquote): some case must fail, saying why, under the reverse or a random schedule."""
    path, text, planted, expected = PLANTED[bug]
    flags = planted_header(tmp_path, path, [(text, planted)])
    if shutil.which(build.CXX) is None or build.cuda_include_dir() is None:
        pytest.skip("no compiler or CUDA headers for the shim")
    exe = build.build_program([SOURCE], f"hopper_fp8_fwd_test_{bug}", build.DEFAULT_BUILD_DIR,
                              extra_flags=flags)
    caught = False
    for case in ("e4m3_d128", "e4m3_d128_causal", "e4m3_d128_seqused_k"):
        for schedule in ("reverse", "random:1"):
            out = run(exe, case, schedule=schedule, timeout=300)
            assert out.returncode in (0, 1, 3), out.stdout + out.stderr
            caught = caught or (out.returncode != 0 and re.search(expected, out.stdout) is not None)
        if caught:
            break
    assert caught, f"planted bug {bug} went unnoticed"


@pytest.mark.skipif(hopper_gemm.nvcc_path() is None, reason="nvcc not found")
def test_gpu_runner_compiles_for_sm90a():
    """tests/cudasim/hopper_fp8_fwd.py --compile-only: both FP8 main loops through ptxas for sm_90a
    with no spill, no stack frame, no serialized wgmma, and (with cuobjdump) QGMMA, TMA and
    mbarrier instructions in the SASS and no local memory."""
    runner = os.path.join(os.path.dirname(__file__), "cudasim", "hopper_fp8_fwd.py")
    out = subprocess.run([sys.executable, runner, "--compile-only", "--ptxas"], capture_output=True,
                         text=True, timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "hopper_fp8_fwd_gpu_sm90a" in out.stdout
    loops = [line for line in out.stdout.splitlines() if "__nv_fp8_e4m3" in line and "spill" in line]
    assert len(loops) == 2 and all("0 bytes spill stores, 0 bytes spill loads" in x for x in loops), out.stdout
