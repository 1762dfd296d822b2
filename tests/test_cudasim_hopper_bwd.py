"""The sm_90a attention backward (csrc/cuda/hopper/bwd_sm90_*, issue 31 stage 5) on the shim:
dQ, dK and dV within the FlashAttention tolerance of a float64 reference
(selftest/hopper_bwd_test.cpp) for bf16 and f16, d = 64 and 128, causal (bottom-right and
top-left) and not, local windows ((w, 0), both edges, one edge, (0, 0), wider than both
sequences, both alignments), ALiBi (slopes [Hq] or [B, Hq], causal or not), softcap (with each
mask), awkward Sq / Sk both
ways, GQA, batch > 1 and two K/V layouts, under every
schedule and copy completion; deterministic dQ bit-identical under all of them (while the shared
accumulator's is not). Its GPU side (tests/cudasim/hopper_bwd.py) must keep compiling for sm_90a
with no spills and no local memory."""
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import program, run  # noqa: E402
import hopper_gemm  # noqa: E402

SCHEDULES = ["forward", "reverse", "random:1", "random:2"]
COMPLETIONS = ["lazy", "eager", "random"]
CASES = ["bf16_d64", "bf16_d128", "f16_d64", "f16_d128", "bf16_d128_causal", "bf16_d64_causal",
         "f16_d64_causal", "f16_d128_causal", "bf16_d64_local", "f16_d128_local", "bf16_d64_alibi",
         "f16_d128_alibi", "bf16_d128_alibi_causal", "f16_d64_alibi_causal", "bf16_d128_softcap",
         "f16_d64_softcap", "f16_d64_causal_softcap", "bf16_d128_causal_softcap", "bf16_d64_local_softcap",
         "f16_d128_local_softcap"]
DETERMINISTIC = ["bf16_d64_deterministic", "bf16_d128_causal_deterministic",
                 "bf16_d64_alibi_causal_deterministic"]


def run_case(case, schedule, completion):
    """The case's output lines; fails the test unless every shape is within tolerance."""
    out = run(program("hopper_bwd_test"), case, schedule=schedule, completion=completion)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("dq-bits ")]
    assert lines and all(line.startswith("ok: ") for line in lines), out.stdout
    return out.stdout


def dq_hashes(stdout):
    return re.findall(r"^dq-bits ([0-9a-f]{16} [0-9a-f]{16})$", stdout, re.M)


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", CASES)
def test_backward_matches_float64(case, schedule, completion):
    run_case(case, schedule, completion)


@pytest.mark.parametrize("stall", ["1", "2"])
@pytest.mark.parametrize("case", CASES)
def test_backward_with_a_consumer_held_back(case, stall, monkeypatch):
    """Both consumers read each other's dS^T for the dQ MMA: with one of them held back
    (CUDASIM_STALL_WARPGROUP) the other runs ahead as far as the named barrier lets it."""
    monkeypatch.setenv("CUDASIM_STALL_WARPGROUP", stall)
    run_case(case, "random:3", "random")


@pytest.mark.parametrize("case", DETERMINISTIC)
def test_deterministic_dq_is_bit_identical_under_every_order(case):
    """One accumulator slice per key block, summed in key-block order: the same dQ bits whatever
    order the blocks, warps and copies run in (and within tolerance each time)."""
    seen = set()
    for schedule in SCHEDULES:
        for completion in COMPLETIONS:
            hashes = dq_hashes(run_case(case, schedule, completion))
            assert hashes, "no dq-bits line"
            seen.add(tuple(hashes))
    assert len(seen) == 1, seen


def test_shared_dq_accumulator_depends_on_block_order():
    """The same shape with every key block adding into one accumulator: its fp32 bits follow the
    block order (three key blocks), so the check above can tell the two apart."""
    forward = dq_hashes(run_case("bf16_d64_shared_dq", "forward", "lazy"))
    reverse = dq_hashes(run_case("bf16_d64_shared_dq", "reverse", "lazy"))
    assert forward and reverse and forward != reverse


def test_query_block_ranges_match_brute_force():
    """Which query blocks a key block visits and which it masks (QueryBlocks), against brute force
    over lengths 1-385, windows (incl. (w, 0), (-1, w), (0, 0) and wider than both sequences) and
    both alignments, for d = 64's 128 x 128 blocks and d = 128's 64 x 128 (host only): exactly the
    blocks some row needs are visited and exactly those with an invisible pair are masked."""
    out = run(program("hopper_bwd_test"), "query_blocks")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok: QueryBlocks") == 6, out.stdout
    skipped = [int(n) for n in re.findall(r"pairs, (\d+) skipped", out.stdout)]
    # No mask skips nothing; causal and local windows skip blocks.
    assert skipped[0] == skipped[3] == 0 and all(n > 0 for n in skipped[1:3] + skipped[4:]), out.stdout


def test_bad_arguments_get_errors_naming_them():
    out = run(program("hopper_bwd_test"), "bad_arguments")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 15 and all(line.startswith("ok: ") for line in lines), out.stdout


@pytest.mark.skipif(hopper_gemm.nvcc_path() is None, reason="nvcc not found")
def test_gpu_runner_compiles_for_sm90a():
    runner = os.path.join(os.path.dirname(__file__), "cudasim", "hopper_bwd.py")
    out = subprocess.run([sys.executable, runner, "--compile-only"], capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "hopper_bwd_gpu_sm90a" in out.stdout
