"""The sm_90a attention forward (csrc/cuda/hopper/, issue 31 stage 4) on the shim: within the
FlashAttention tolerance of a float64 reference (selftest/hopper_fwd_test.cpp) for bf16 and f16,
d = 64, 128 and 256, causal (bottom-right and top-left) and not, local windows, softcap, ALiBi, awkward
Sq / Sk both ways, GQA, batch > 1 and two K/V layouts, under every schedule and copy
completion; the dense kernels' dynamic tile walk at 1, 2 and 3 SMs and at SMs - 1, SMs, SMs + 1 and
4 SMs + 3 tiles (the counter read only past the grid); the key-tile ranges against
brute force. Its GPU side (tests/cudasim/hopper_fwd.py)
must keep compiling for sm_90a with no spills."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
from fixtures import assert_every_line_ok, program, run  # noqa: E402
import hopper_gemm  # noqa: E402

SCHEDULES = ["forward", "reverse", "random:1", "random:2"]
COMPLETIONS = ["lazy", "eager", "random"]
CASES = ["bf16_d64", "bf16_d128", "f16_d64", "f16_d128", "bf16_d128_causal", "bf16_d64_causal",
         "f16_d64_causal", "f16_d128_causal", "bf16_d64_causal_top_left", "bf16_d128_softcap",
         "f16_d64_causal_softcap", "bf16_d64_local", "f16_d128_local", "bf16_d128_alibi",
         "f16_d64_causal_alibi", "bf16_d256", "f16_d256_causal", "bf16_d256_local", "f16_d256_softcap",
         "bf16_d256_causal_softcap", "bf16_d256_alibi", "f16_d256_causal_alibi"]


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", CASES)
def test_forward_matches_float64(case, schedule, completion):
    out = run(program("hopper_fwd_test"), case, schedule=schedule, completion=completion)
    assert_every_line_ok(out)


WALK_CASES = ["walk_bf16_d64_causal", "walk_f16_d64_local", "walk_bf16_d128"]


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("sms", [1, 2, 3])
@pytest.mark.parametrize("case", WALK_CASES)
def test_walk_matches_float64(monkeypatch, case, sms, schedule, completion):
    """The dense kernels' dynamic walk (hopper/fwd_sm90_walk.h; d = 64 no mask, causal and local,
    d = 128 no mask and causal) at 1, 2 and 3 SMs: min(tiles, SMs)
    CTAs, each taking its own place (blockIdx.x) and then places past the grid's from the
    launch's counter until it is spent (read only when the tiles outnumber the SMs; its final
    count checked). The shim runs blocks one after another, so block 0 takes every place past
    the grid: up to 17 tiles of 0-3 key tiles each through one CTA's barriers. (The matrix above
    runs at the shim's default 2 SMs.)"""
    monkeypatch.setenv("CUDASIM_SM_COUNT", str(sms))
    out = run(program("hopper_fwd_test"), case, schedule=schedule, completion=completion)
    assert_every_line_ok(out)


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("sms", [1, 2, 5])
def test_walk_tiles_against_sms(monkeypatch, sms, schedule, completion):
    """The walk at SMs - 1, SMs, SMs + 1 and 4 SMs + 3 tiles (d = 64 causal, d = 128 no mask):
    each CTA's first tile is its own place, the counter is read (`tiles` atomic adds, its final
    value) only when the tiles outnumber the SMs and is never given otherwise; a launch without
    a counter runs where the grid covers every tile and names what it needs where not."""
    monkeypatch.setenv("CUDASIM_SM_COUNT", str(sms))
    out = run(program("hopper_fwd_test"), "walk_tiles_vs_sms", schedule=schedule, completion=completion)
    assert_every_line_ok(out)
    assert out.stdout.count("without a tile counter") == 2, out.stdout


def test_key_tile_ranges_match_brute_force():
    """Which key tiles a query tile visits and which it takes unmasked (KeyTiles), against
    brute force over lengths 1-385, windows and both alignments, for the 128 x 128 tiles and
    d = 256's 128 x 64 (host only)."""
    out = run(program("hopper_fwd_test"), "key_tiles")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok: KeyTiles") == 6, out.stdout


@pytest.mark.skipif(hopper_gemm.nvcc_path() is None, reason="nvcc not found")
def test_gpu_runner_compiles_for_sm90a():
    runner = os.path.join(os.path.dirname(__file__), "cudasim", "hopper_fwd.py")
    out = subprocess.run([sys.executable, runner, "--compile-only"], capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "hopper_fwd_gpu_sm90a" in out.stdout
