"""Split-KV's automatic count (num_splits=0; csrc/cuda/plan_fwd.h, choose_num_splits): the split
each decoding shape gets on an H200-like (132 SMs) and an A100-like (108 SMs) device, pinned;
the step-time model it minimizes, mirrored in tools/gpu_model.py (split_step_ns) and checked
against the C++ choice; and the forward's results with the chosen splits on the CPU shim.

The model, in ns (plan_fwd.h states it in full): a CTA's key tiles one after another at
kSplitTileNs each, plus kSplitCtaNs, in waves of sm_count x 2 CTAs, at least the cache's bytes
over sm_count x kSplitSmBytesPerNs; a split adds the merge: a launch plus ceil(head_dim / 32) x s
steps per merging warp (split_merge_kernel.cuh gives a row a warp, its lanes over the columns).
See docs/lab/2026-12-02-decode-splits.md for the model and docs/lab/2026-12-02-decode-part-2.md
for the merge.
"""
import json
import math

import pytest
import torch

from executors import make_executor
from flashattn._reference import attention_reference
from repo_tools import load_tool
from tolerance import assert_within_torch_error

H200 = dict(cc_major=9, cc_minor=0, sm_count=132, smem_optin_bytes=227 * 1024)
A100 = dict(cc_major=8, cc_minor=0, sm_count=108, smem_optin_bytes=163 * 1024)
DEVICES = {"h200": H200, "a100": A100}
HQ, D = 32, 128


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


def decode_inputs(b, sq, sk, hkv, hq=HQ, d=D, dtype=torch.bfloat16):
    """q, and a K/V cache of B x Sk x Hkv x d that takes no memory (stride 0 but the last dim):
    the plan reads shapes only."""
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    row = torch.zeros(d, dtype=dtype)
    k = row.expand(b, sk, hkv, d)
    return q, k, k


def plan(sim, b, sq, sk, hkv, device, **kwargs):
    q, k, v = decode_inputs(b, sq, sk, hkv)
    return json.loads(sim.ops.plan_fwd(q, k, v, causal=True, num_splits=0, **kwargs,
                                       **DEVICES[device]))


# (device, Hkv, B, Sq) -> splits at Sk = 512, 8k, 32k; Hq 32, d 128, bf16, causal. The CTAs
# (grid) that run them in the comment. Hkv 8 packs 4 query heads per kv head (B x 8 CTAs);
# Hkv 1 packs 32 heads of one token (B CTAs), and 4 tokens x 32 heads as 2 tiles of 64 rows
# (B x 2 CTAs; gqa_decode.h packs while its tiles are fewer than the heads). With the merge's
# warp per row (split_merge_kernel.cuh) a split costs the merge ceil(128 / 32) = 4 steps, not
# 128, so one sequence splits until its CTAs fill the SMs at 32k keys (18 x 8 = 144 CTAs on the
# H200's 132, 14 x 8 = 112 on the A100's 108), and a batch whose CTAs fill them stays unsplit.
PINNED = {
    ("a100", 1, 1, 1): (1, 13, 27),  # CTAs [1, 13, 27]
    ("a100", 1, 1, 4): (1, 13, 27),  # CTAs [2, 26, 54]
    ("a100", 1, 8, 1): (1, 13, 14),  # CTAs [8, 104, 112]
    ("a100", 1, 8, 4): (1, 13, 13),  # CTAs [16, 208, 208]
    ("a100", 1, 32, 1): (1, 4, 4),   # CTAs [32, 128, 128]
    ("a100", 1, 32, 4): (1, 3, 10),  # CTAs [64, 192, 640]
    ("a100", 8, 1, 1): (1, 13, 14),  # CTAs [8, 104, 112]
    ("a100", 8, 1, 4): (1, 13, 14),  # CTAs [8, 104, 112]
    ("a100", 8, 8, 1): (1, 2, 2),    # CTAs [64, 128, 128]
    ("a100", 8, 8, 4): (1, 2, 2),    # CTAs [64, 128, 128]
    ("a100", 8, 32, 1): (1, 1, 1),   # CTAs [256, 256, 256]
    ("a100", 8, 32, 4): (1, 1, 1),   # CTAs [256, 256, 256]
    ("h200", 1, 1, 1): (1, 13, 27),  # CTAs [1, 13, 27]
    ("h200", 1, 1, 4): (1, 13, 27),  # CTAs [2, 26, 54]
    ("h200", 1, 8, 1): (1, 13, 18),  # CTAs [8, 104, 144]
    ("h200", 1, 8, 4): (1, 13, 16),  # CTAs [16, 208, 256]
    ("h200", 1, 32, 1): (1, 5, 5),   # CTAs [32, 160, 160]
    ("h200", 1, 32, 4): (1, 4, 4),   # CTAs [64, 256, 256]
    ("h200", 8, 1, 1): (1, 13, 18),  # CTAs [8, 104, 144]
    ("h200", 8, 1, 4): (1, 13, 18),  # CTAs [8, 104, 144]
    ("h200", 8, 8, 1): (1, 3, 3),    # CTAs [64, 192, 192]
    ("h200", 8, 8, 4): (1, 3, 3),    # CTAs [64, 192, 192]
    ("h200", 8, 32, 1): (1, 1, 1),   # CTAs [256, 256, 256]
    ("h200", 8, 32, 4): (1, 1, 1),   # CTAs [256, 256, 256]
}


@pytest.mark.parametrize("device", sorted(DEVICES))
@pytest.mark.parametrize("hkv", [1, 8])
@pytest.mark.parametrize("b", [1, 8, 32])
@pytest.mark.parametrize("sq", [1, 4])
def test_pinned_splits(sim, device, hkv, b, sq):
    want = PINNED[device, hkv, b, sq]
    got = tuple(plan(sim, b, sq, sk, hkv, device)["num_splits"] for sk in (512, 8192, 32768))
    assert got == want


@pytest.mark.parametrize("device", sorted(DEVICES))
@pytest.mark.parametrize("d", [64, 128, 256])
def test_the_model_mirror_chooses_as_the_plan(sim, device, d):
    """tools/gpu_model.py models the step with plan_fwd.h's constants (read from the header) and
    its own copy of the formula: both must choose the same count, so the modeled figures are
    those of the splits the plan runs."""
    model = load_tool("gpu_model")
    c = model.split_constants()
    assert set(c) == {"kMaxSplits", "kSplitMinTiles", "kSplitTileNs", "kSplitCtaNs",
                      "kSplitCtasPerSm", "kSplitSmBytesPerNs", "kSplitMergeLaunchNs",
                      "kSplitMergeStepNs", "kSplitMergeWarpsPerSm"}
    sms = DEVICES[device]["sm_count"]
    for b, sq, hq, hkv, sk in [(1, 1, 32, 8, 65536), (2, 1, 8, 2, 4096), (1, 4, 32, 1, 20000),
                               (4, 2, 16, 4, 1000), (3, 16, 4, 4, 16384), (1, 1, 64, 1, 131072)]:
        q = torch.zeros(b, sq, hq, d, dtype=torch.float16)
        kv = torch.zeros(d, dtype=torch.float16).expand(b, sk, hkv, d)
        got = json.loads(sim.ops.plan_fwd(q, kv, kv, num_splits=0, **DEVICES[device]))
        geometry = model.decode_geometry(b, sq, hq, hkv, d)
        assert (got["packed_heads"], got["block_rows"]) == (geometry["packed"],
                                                            geometry["block_rows"])
        assert got["num_splits"] == model.best_splits(c, geometry, sk, sms), (b, sq, hq, hkv, sk)


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_batches_that_fill_the_gpu_do_not_split(sim, device):
    """B x Hkv CTAs at or above the SMs: HBM bounds the step already; a merge would only add."""
    sms = DEVICES[device]["sm_count"]
    for b, hkv in [(32, 8), (64, 8), (128, 8), (sms, 1), (256, 1)]:
        for sk in (512, 8192, 32768, 131072):
            got = plan(sim, b, 1, sk, hkv, device)
            assert b * hkv >= sms and got["num_splits"] == 1 and not got["merges"], (b, hkv, sk)


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_one_sequence_fills_the_sms_as_its_cache_grows(sim, device):
    """B = 1 (Hkv 8): the count grows with Sk while the step is bound by the tiles' latency
    (never above kMaxSplits, never a split under kSplitMinTiles = 4 key tiles of 64), a split
    never makes the modeled step slower, and from 32k keys on the splits' CTAs cover every SM.
    Past that the cache's bytes bound the step (the HBM term), and the count may settle a
    little lower: fewer splits merge faster once more of them would only wait on HBM."""
    model = load_tool("gpu_model")
    c = model.split_constants()
    sms = DEVICES[device]["sm_count"]
    last = 1
    for sk in (256, 511, 512, 1024, 4096, 8192, 32768, 131072, 1 << 20):
        got = plan(sim, 1, 1, sk, 8, device)["num_splits"]
        assert got <= min(64, max(1, math.ceil(sk / 64) // 4)), sk
        if sk <= 32768:
            assert last <= got, sk
        if sk >= 32768:
            assert got * 8 >= sms, (sk, got)
        g = model.decode_geometry(1, 1, HQ, 8, D)
        t = {s: model.split_step_ns(c, **g, seqlen_k=sk, sms=sms, splits=s) for s in (1, got)}
        assert t[got] <= t[1]
        last = got


def test_explicit_num_splits_is_kept(sim):
    q, k, v = decode_inputs(1, 1, 32768, 8)
    for n, want in [(1, 1), (3, 3), (64, 64), (100, 64)]:
        got = json.loads(sim.ops.plan_fwd(q, k, v, num_splits=n, **H200))
        assert got["num_splits"] == want


# ---- the chosen splits on the shim ----

SHIM = dict(cc_major=8, cc_minor=0, sm_count=8, smem_optin_bytes=227 * 1024)  # sim_ops.cpp


# (B, Sq, Hq, Hkv, d, Sk, dtype) -> the splits num_splits=0 gives on the shim's 8 SMs.
SHIM_CASES = {
    "b1_sq1_d32_bf16": ((1, 1, 8, 2, 32, 4096, torch.bfloat16), 8),
    "b1_sq4_d64_f16": ((1, 4, 8, 2, 64, 4096, torch.float16), 8),
}


@pytest.mark.parametrize("case", sorted(SHIM_CASES))
def test_b1_long_keys_on_the_shim(sim, case):
    """One sequence with a long cache (num_splits=0, the plan's count for the shim's 8 SMs):
    the forward launch is the plan's grid, the merge runs, and out and lse are within 2x of
    PyTorch's own error in the same dtype from the float64 reference."""
    (b, sq, hq, hkv, d, sk, dtype), splits = SHIM_CASES[case]
    gen = torch.Generator().manual_seed(sk + d)
    q = torch.randn(b, sq, hq, d, generator=gen).to(dtype)
    k, v = (torch.randn(b, sk, hkv, d, generator=gen).to(dtype) for _ in range(2))
    planned = json.loads(sim.ops.plan_fwd(q, k, v, causal=True, num_splits=0, **SHIM))
    assert planned["num_splits"] == splits and planned["packed_heads"] == hq // hkv
    seqlens = torch.full((b,), sk, dtype=torch.int32)
    (out, lse), launches = sim.launches(lambda: sim.ops.fwd_kvcache(
        q, k.clone(), v.clone(), cache_seqlens=seqlens, causal=True, num_splits=0))
    fwd, merge = launches
    assert "fwd_kernel_16bit" in fwd["kernel"] and "split_merge_kernel" in merge["kernel"]
    assert fwd["grid"] == planned["grid"] == [splits, b * hkv, 1]
    ref_out, ref_lse = attention_reference(q.double(), k.double(), v.double(), causal=True)
    low_out, low_lse = attention_reference(q, k, v, causal=True)
    assert_within_torch_error("out", out, ref_out, low_out)
    assert_within_torch_error("lse", lse, ref_lse, low_lse.float())
    # Unsplit, the same call is as close: the merge is exact up to fp32 sums.
    one_out, one_lse = sim.ops.fwd_kvcache(q, k.clone(), v.clone(), cache_seqlens=seqlens,
                                           causal=True, num_splits=1)
    assert_within_torch_error("out, num_splits=1", one_out, ref_out, low_out)
    assert (lse - one_lse).abs().max() < 1e-4
