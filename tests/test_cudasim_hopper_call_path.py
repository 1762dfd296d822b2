"""The sm_90a forward as the library runs it: torch.ops.flashattn_sim.fwd, the same op glue, checks,
plan (plan_fwd.h -> plan_fwd_sm90.h) and launch code (launch_plan.h -> launch_fwd_sm90.cuh) as
torch.ops.flashattn on a GPU, on a device the shim presents as compute capability 9.0 with
FLASHATTN_CUDA_HOPPER=1 (set_device). Outputs are poisoned before the kernel writes them
(FLASHATTN_POISON_OUTPUTS, conftest.py); out and lse are compared with the float64 reference
within 2x PyTorch's own error in the dtype (checks.check_forward). The shim's counters show which
kernel ran.

Every case runs under the forward, reverse and a random warp schedule, each with lazy, eager and
random completion of the TMA copies (tests/cudasim/README.md): a missing wait or an early stage
release shows up as a named error or a wrong result under one of them.
"""

import json

import pytest
import torch

from checks import MASKS, check_forward, mask_arguments, to64
from flashattn._reference import attention_reference
from hopper_sim import ELEMENTS, launched, schedule_fixture, wgmma_instructions
from tolerance import assert_within_torch_error


schedule = schedule_fixture()


def qkv(b, sq, sk, hq, hkv, d, dtype, kv_bhsd=False):
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    if kv_bhsd:  # K and V stored [B, Hkv, Sk, D], seen as [B, Sk, Hkv, D]
        k, v = (torch.randn(b, hkv, sk, d, dtype=dtype).transpose(1, 2) for _ in range(2))
    else:
        k, v = (torch.randn(b, sk, hkv, d, dtype=dtype) for _ in range(2))
    return q, k, v


# (dtype, head dim, mask, B, Sq, Sk, Hq, Hkv, K/V as [B, H, S, D]): both dtypes and head dims,
# causal in both alignments, ragged lengths past both tiles, Sq != Sk both ways (bottom-right
# causal with Sq > Sk has rows that see no key: out 0, lse -inf), GQA, one query.
CASES = [
    (torch.bfloat16, 64, "none", 1, 65, 129, 2, 1, True),
    (torch.float16, 128, "none", 1, 127, 63, 1, 1, False),
    (torch.float16, 64, "causal", 2, 129, 63, 1, 1, False),
    (torch.bfloat16, 128, "causal", 1, 7, 257, 2, 2, True),
    (torch.bfloat16, 64, "causal_top_left", 1, 257, 65, 3, 1, False),
    (torch.float16, 128, "causal_top_left", 1, 1, 1, 1, 1, False),
    # d = 256: 64-key tiles, so the diagonal and the ragged tails fall elsewhere in a tile.
    (torch.float16, 256, "causal", 1, 129, 65, 2, 1, True),
    (torch.bfloat16, 256, "none", 1, 63, 161, 1, 1, False),
]


@pytest.mark.parametrize("dtype, d, mask, b, sq, sk, hq, hkv, kv_bhsd", CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_forward_through_the_library(schedule, hopper, dtype, d, mask, b, sq, sk, hq,
                                            hkv, kv_bhsd):
    inputs = qkv(b, sq, sk, hq, hkv, d, dtype, kv_bhsd)
    (out, lse), counters = hopper.counted(lambda: check_forward(hopper, *inputs, MASKS[mask]))
    # One launch, of the Hopper kernel with the causal mask or without (and none of the rest).
    causal = "true" if "causal" in mask else "false"
    kernels = launched(counters)
    assert len(kernels) == 1, kernels
    assert f"fwd_sm90_kernel<{ELEMENTS[dtype]}, {d}, {causal}, false, false, false, false, false, false>" in kernels[0]
    assert wgmma_instructions(counters) > 0
    assert out.isfinite().all()
    if mask == "causal" and sq > sk:
        # Bottom-right causal: the first Sq - Sk rows see no key.
        assert (out[:, : sq - sk] == 0).all()
        assert (lse[:, :, : sq - sk] == float("-inf")).all()


@pytest.mark.parametrize("d, mask, walks", [(64, "causal", True), (64, "window", True), (128, "none", True),
                                            (128, "window", False), (256, "causal", False)])
def test_hopper_forward_walks_on_one_cta_per_sm(hopper, d, mask, walks):
    """The kernels that walk tiles (hopper/fwd_sm90_walk.h: d = 64 no mask, causal, local; d = 128
    no mask, causal) launch min(tiles, SMs) CTAs, here the shim's 2 SMs (cudasim::sm_count) for 3
    query blocks x 2 heads x 2 sequences; the others one CTA per tile, (3, 2, 2)."""
    q, k, v = qkv(2, 257, 257, 2, 2, d, torch.bfloat16)
    (out, lse), counters = hopper.counted(lambda: check_forward(hopper, q, k, v, MASKS[mask]))
    kernels = launched(counters)
    assert len(kernels) == 1 and "fwd_sm90_kernel<" in kernels[0], kernels
    assert counters["launches"][0]["grid"] == ([2, 1, 1] if walks else [3, 2, 2])


# The walk against the SM count (CUDASIM_SM_COUNT = 4): tiles 3, 4 (the grid covers them: no
# counter allocated, so a launch that read one would fail), 5 and 19 (the places past the grid's
# from the counter, one atomicAdd each plus each CTA's last look: `tiles` in all).
WALK_SMS = 4


@pytest.mark.parametrize("tiles", [WALK_SMS - 1, WALK_SMS, WALK_SMS + 1, 4 * WALK_SMS + 3])
@pytest.mark.parametrize("dtype, d, mask", [(torch.bfloat16, 64, "causal"), (torch.float16, 128, "none")],
                         ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_walk_takes_the_counter_only_past_the_grid(schedule, hopper, monkeypatch, dtype, d, mask, tiles):
    """The executor gives a walking call a tile counter only where its tiles outnumber the SMs
    (hopper::fwd_sm90_walk_counts, on the launch's own SM count): below that every CTA runs its
    own place (blockIdx.x) and no CTA touches a counter (no atomics; the launch refuses a walk
    that needs one and has none). One query block per (batch, head), Sq 65 against Sk 129."""
    monkeypatch.setenv("CUDASIM_SM_COUNT", str(WALK_SMS))
    q, k, v = qkv(1, 65, 129, tiles, 1, d, dtype)
    (out, lse), counters = hopper.counted(lambda: check_forward(hopper, q, k, v, MASKS[mask]))
    launch = counters["launches"][0]
    assert len(counters["launches"]) == 1 and "fwd_sm90_kernel<" in launch["kernel"], launched(counters)
    assert launch["grid"] == [min(tiles, WALK_SMS), 1, 1]
    assert launch["counters"]["atomics"]["ops"] == (tiles if tiles > WALK_SMS else 0)


@pytest.mark.parametrize("dtype, d, mask", [(torch.bfloat16, 64, "causal"),
                                            (torch.float16, 128, "none"),
                                            (torch.bfloat16, 128, "causal_top_left"),
                                            (torch.float16, 256, "none")],
                         ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_seqused_k(schedule, hopper, dtype, d, mask):
    # Batch b attends to its first seqused_k[b] keys only (causal aligned to that length): all
    # 200, none (out 0, lse -inf), 77 (a ragged tile, the rest of the keys never visited) and 129
    # (one key into the second tile).
    used = torch.tensor([200, 0, 77, 129], dtype=torch.int32)
    q, k, v = qkv(4, 65, 200, 2, 1, d, dtype)
    # The rows past seqused_k take no part, whatever they hold (a KV cache's unwritten rows):
    # NaN and Inf there must not reach out (P = 0 times V = NaN would).
    for b, n in enumerate(used.tolist()):
        k[b, n:] = float("nan")
        v[b, n:] = float("inf") if b % 2 else float("nan")
    scale, op_kwargs, ref_kwargs = mask_arguments(MASKS[mask], q)
    (out, lse), counters = hopper.counted(
        lambda: hopper.fwd(q, k, v, scale, seqused_k=used, **op_kwargs))
    assert len(launched(counters)) == 1 and "fwd_sm90_kernel<" in launched(counters)[0]
    for b, n in enumerate(used.tolist()):
        if n == 0:
            assert (out[b] == 0).all() and (lse[b] == float("-inf")).all()
            continue
        qb, kb, vb = q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n]
        ref_out, ref_lse = attention_reference(to64(qb), to64(kb), to64(vb), **ref_kwargs)
        low_out, low_lse = attention_reference(qb, kb, vb, **ref_kwargs)
        assert_within_torch_error(f"out[{b}]", out[b:b + 1], ref_out, low_out)
        assert_within_torch_error(f"lse[{b}]", lse[b:b + 1], ref_lse, low_lse.float())


def check_sequence(name, out, lse, q, k, v, ref_kwargs):
    """out [Sq, Hq, D] and lse [Hq, Sq] of one sequence against the float64 reference of its
    q [Sq, Hq, D], k, v [Sk, Hkv, D]; with no key, out 0 and lse -inf."""
    if k.shape[0] == 0:
        assert (out == 0).all() and (lse == float("-inf")).all(), name
        return
    ref_out, ref_lse = attention_reference(to64(q[None]), to64(k[None]), to64(v[None]),
                                           **ref_kwargs)
    low_out, low_lse = attention_reference(q[None], k[None], v[None], **ref_kwargs)
    assert_within_torch_error(f"out {name}", out[None], ref_out, low_out)
    assert_within_torch_error(f"lse {name}", lse[None], ref_lse, low_lse.float())


MASK_CASES = [(torch.bfloat16, 64, "causal"), (torch.float16, 128, "none"),
              (torch.bfloat16, 128, "causal_top_left"), (torch.bfloat16, 256, "causal")]


@pytest.mark.parametrize("dtype, d, mask", MASK_CASES, ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_varlen(schedule, hopper, dtype, d, mask):
    # Four packed sequences (queries / keys): 65 / 129, 1 / 7, 200 / 64 (bottom-right causal:
    # 136 rows see no key) and 3 / 0, then 5 rows past the last one, which no sequence owns (out 0,
    # lse -inf) and whose K and V hold NaN / Inf (as unwritten memory may).
    lens_q, lens_k = [65, 1, 200, 3], [129, 7, 64, 0]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    hq, hkv = 2, 1
    q = torch.randn(int(cu_q[-1]) + 5, hq, d, dtype=dtype)
    k, v = (torch.randn(int(cu_k[-1]) + 5, hkv, d, dtype=dtype) for _ in range(2))
    k[int(cu_k[-1]):] = float("nan")
    v[int(cu_k[-1]):] = float("inf")
    scale, op_kwargs, ref_kwargs = mask_arguments(MASKS[mask], q[None])
    (out, lse), counters = hopper.counted(lambda: hopper.fwd(
        q, k, v, scale, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
        max_seqlen_k=max(lens_k), **op_kwargs))
    assert len(launched(counters)) == 1 and "fwd_sm90_kernel<" in launched(counters)[0]
    for b in range(len(lens_q)):
        qa, qb, ka, kb = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        check_sequence(f"sequence {b}", out[qa:qb], lse[:, qa:qb], q[qa:qb], k[ka:kb], v[ka:kb],
                       ref_kwargs)
    assert (out[int(cu_q[-1]):] == 0).all() and (lse[:, int(cu_q[-1]):] == float("-inf")).all()


@pytest.mark.parametrize("dtype, d, mask", MASK_CASES, ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_seqused_q(schedule, hopper, dtype, d, mask):
    # Batch b's first seqused_q[b] queries against its first seqused_k[b] keys; the other rows
    # are the host's (out 0, lse -inf), never overwritten by the kernel's 64-row stores.
    used_q = torch.tensor([65, 0, 30], dtype=torch.int32)
    used_k = torch.tensor([100, 50, 129], dtype=torch.int32)
    q, k, v = qkv(3, 65, 129, 2, 2, d, dtype)
    scale, op_kwargs, ref_kwargs = mask_arguments(MASKS[mask], q)
    (out, lse), counters = hopper.counted(lambda: hopper.fwd(
        q, k, v, scale, seqused_q=used_q, seqused_k=used_k, **op_kwargs))
    assert len(launched(counters)) == 1 and "fwd_sm90_kernel<" in launched(counters)[0]
    for b, (nq, nk) in enumerate(zip(used_q.tolist(), used_k.tolist())):
        check_sequence(f"batch {b}", out[b, :nq], lse[b, :, :nq], q[b, :nq], k[b, :nk], v[b, :nk],
                       ref_kwargs)
        assert (out[b, nq:] == 0).all() and (lse[b, :, nq:] == float("-inf")).all()


def test_what_hopper_lacks_runs_on_sm80(hopper):
    # A scale <= 0 is not taken (plan_fwd_sm90.h): the same call on the same opted-in device runs
    # mma.sync, and is right.
    inputs = qkv(1, 65, 129, 2, 1, 64, torch.bfloat16)
    spec = MASKS["negative_scale"]
    _, counters = hopper.counted(lambda: check_forward(hopper, *inputs, spec))
    assert launched(counters)
    assert [k for k in launched(counters) if "fwd_kernel_16bit" in k] == launched(counters)
    assert wgmma_instructions(counters) == 0


def test_not_opted_in_runs_sm80(sim):
    sim.ops.set_device(9, 0, False)
    try:
        inputs = qkv(1, 65, 129, 2, 1, 64, torch.bfloat16)
        _, counters = sim.counted(lambda: check_forward(sim, *inputs, MASKS["causal"]))
    finally:
        sim.ops.set_device(8, 0, False)
    assert launched(counters)
    assert [k for k in launched(counters) if "fwd_kernel_16bit" in k] == launched(counters)
    assert wgmma_instructions(counters) == 0


def test_hopper_forward_feeds_the_backward(hopper):
    # The backward (sm_80 kernels) reads the Hopper forward's out and lse: gradients right.
    from checks import check_backward
    inputs = qkv(1, 65, 129, 2, 1, 64, torch.float16)
    check_backward(hopper, *inputs, MASKS["causal"])


def sm90_kernel(dtype, d, causal, window=(-1, -1), softcap=0.0, alibi=False, gather=False):
    """The Hopper kernel a call runs: its template arguments (Elem, d, kCausal, kSoftcap, kLocal,
    kAlibi, kAttnMask: none here, kGatherKv, kDropout: none here), by plan_fwd_sm90.h's sm90_fwd_mask (causal is the window's right edge at 0)."""
    left, right = window
    if causal:
        right = 0
    is_causal = left < 0 and right == 0
    is_local = not is_causal and (left >= 0 or right >= 0)
    # The ALiBi loops take softcap at run time: their kSoftcap is false.
    flags = ", ".join(str(x).lower() for x in (is_causal, softcap > 0 and not alibi, is_local, alibi, False, gather,
                                               False))
    return f"fwd_sm90_kernel<{ELEMENTS[dtype]}, {d}, {flags}>"


# Softcap, local windows and ALiBi: (dtype, head dim, mask, B, Sq, Sk, Hq, Hkv). Windows on both
# sides, one side only, with causal, in both alignments; softcap alone and causal; ALiBi with
# [Hq] and [B, Hq] slopes, causal and not; awkward lengths.
FEATURE_CASES = [
    (torch.bfloat16, 64, "softcap", 1, 65, 129, 2, 1),
    (torch.float16, 128, "softcap_causal", 1, 129, 63, 1, 1),
    (torch.bfloat16, 128, "window", 1, 257, 129, 2, 2),
    (torch.float16, 64, "window_left_only", 2, 63, 257, 1, 1),
    (torch.bfloat16, 64, "window_right_only", 1, 129, 7, 1, 1),
    (torch.float16, 128, "window_causal", 1, 200, 65, 2, 1),
    (torch.bfloat16, 64, "window_top_left", 1, 127, 300, 1, 1),
    (torch.bfloat16, 128, "alibi", 1, 65, 257, 4, 2),
    (torch.float16, 64, "alibi_batch_causal", 2, 129, 63, 2, 2),
    (torch.bfloat16, 256, "window", 1, 129, 257, 1, 1),
    (torch.float16, 256, "softcap_causal", 1, 65, 129, 2, 1),
    (torch.bfloat16, 256, "alibi", 1, 65, 161, 2, 1),
    # ALiBi with a window and with softcap (every head dim),
    # softcap being a run-time choice inside the ALiBi loops.
    (torch.bfloat16, 64, "window_alibi_top_left", 1, 65, 129, 2, 1),
    (torch.float16, 128, "alibi_batch_window", 2, 257, 63, 2, 2),
    (torch.float16, 64, "alibi_softcap", 1, 127, 257, 3, 1),
    (torch.bfloat16, 128, "alibi_batch_softcap_causal", 2, 129, 65, 2, 2),
    (torch.bfloat16, 128, "all", 1, 200, 129, 2, 1),
    (torch.float16, 64, "alibi_softcap", 1, 1, 1, 1, 1),
    (torch.float16, 256, "alibi_batch_softcap_causal", 1, 65, 129, 2, 1),
    (torch.bfloat16, 256, "alibi_softcap", 1, 63, 7, 1, 1),
    (torch.bfloat16, 256, "window_alibi_top_left", 1, 65, 129, 2, 1),
    (torch.float16, 256, "alibi_batch_window", 2, 129, 257, 2, 1),
    (torch.bfloat16, 256, "alibi_window_causal", 1, 257, 63, 1, 1),
    # Softcap with a window at d = 256: softcap's own window loop (lean S descriptors:
    # fwd_sm90_kernel.cuh kLeanDescriptors) and ALiBi's window loop with softcap at run time.
    # Windows on both sides, one side only, with causal, wider than a 64-key tile (whole tiles
    # inside the window, unmasked), in both alignments; Sq != Sk both ways, GQA, a decode (one
    # query: with Sq = Sk = 1 the plan drops a window that hides nothing).
    (torch.bfloat16, 256, "softcap_window", 1, 65, 129, 2, 1),
    (torch.float16, 256, "softcap_window_top_left", 1, 257, 63, 1, 1),
    (torch.bfloat16, 256, "softcap_window_left_only", 2, 7, 257, 4, 2),
    (torch.float16, 256, "softcap_window_right_only", 1, 129, 127, 2, 2),
    (torch.bfloat16, 256, "softcap_window_causal", 1, 127, 129, 1, 1),
    (torch.float16, 256, "softcap_window_wide", 1, 129, 257, 3, 1),
    (torch.bfloat16, 256, "softcap_window_wide_top_left", 1, 63, 257, 1, 1),
    (torch.float16, 256, "softcap_window", 1, 1, 257, 1, 1),
    (torch.float16, 256, "alibi_batch_softcap_window", 1, 65, 129, 2, 1),
    (torch.bfloat16, 256, "alibi_softcap_window_top_left", 2, 129, 63, 2, 2),
    (torch.float16, 256, "alibi_softcap_window_causal", 1, 257, 129, 2, 1),
]
FEATURE_MASKS = dict(MASKS, window_top_left=dict(window=(9, 30), align_bottom_right=False),
                     alibi_batch_window=dict(alibi="batch_heads", window=(40, 3)),
                     alibi_window_causal=dict(alibi="heads", window=(20, -1), causal=True),
                     alibi_softcap=dict(alibi="heads", softcap=2.0),
                     alibi_batch_softcap_causal=dict(alibi="batch_heads", softcap=1.5, causal=True),
                     softcap_window=dict(softcap=2.5, window=(16, 5)),
                     softcap_window_top_left=dict(softcap=2.0, window=(9, 30), align_bottom_right=False),
                     softcap_window_left_only=dict(softcap=1.5, window=(40, -1)),
                     softcap_window_right_only=dict(softcap=3.0, window=(-1, 3)),
                     softcap_window_causal=dict(softcap=2.5, window=(20, -1), causal=True),
                     softcap_window_wide=dict(softcap=2.0, window=(150, 70)),
                     softcap_window_wide_top_left=dict(softcap=1.0, window=(30, 130),
                                                       align_bottom_right=False),
                     alibi_batch_softcap_window=dict(alibi="batch_heads", softcap=2.0, window=(40, 3)),
                     alibi_softcap_window_top_left=dict(alibi="heads", softcap=1.5, window=(30, 10),
                                                        align_bottom_right=False),
                     alibi_softcap_window_causal=dict(alibi="heads", softcap=2.5, window=(70, -1),
                                                      causal=True))


@pytest.mark.parametrize("dtype, d, mask, b, sq, sk, hq, hkv", FEATURE_CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_softcap_and_windows(schedule, hopper, dtype, d, mask, b, sq, sk, hq, hkv):
    inputs = qkv(b, sq, sk, hq, hkv, d, dtype)
    spec = FEATURE_MASKS[mask]
    (out, lse), counters = hopper.counted(lambda: check_forward(hopper, *inputs, spec))
    want = sm90_kernel(dtype, d, spec.get("causal", False), spec.get("window", (-1, -1)),
                       spec.get("softcap", 0.0), "alibi" in spec)
    kernels = launched(counters)
    assert len(kernels) == 1 and want in kernels[0], (want, kernels)


# Split-KV through flash_attn_with_kvcache's op (fwd_kvcache: cache_seqlens is seqused_k):
# (dtype, head dim, causal, B, Sq, cache rows, Hq, Hkv, cache_seqlens, num_splits).
# - a decode (Sq = 1) in 3 parts: a full cache of 3 tiles (a part each), an empty one (every part
#   empty: out 0, lse -inf), and 129 keys (2 tiles in 3 parts: one part empty);
# - GQA with 65 queries (2 x 65 rows fill 3 tiles, more than the group: not packed), 2 parts;
# - 129 queries (2 query tiles) causal over 257 keys in 4 parts (3 tiles: one part empty), the
#   diagonal and the ragged tail in different parts;
# - a decode of one sequence of 2000 keys with num_splits=0: the plan's own count (4 on the
#   shim's 8 SMs), so the choice and the kernel meet;
# - a local window with softcap over 600 keys (5 tiles) in 3 parts: tiles left of the window
#   never visited, the window's two edges in different parts;
# - d = 256 (64-key tiles), a causal decode in 3 parts: 257 keys (5 tiles) and 100 (2 tiles,
#   one part empty).
SPLIT_CASES = [
    (torch.bfloat16, 128, True, 3, 1, 300, 2, 2, [300, 0, 129], 3, {}),
    (torch.float16, 64, False, 2, 65, 257, 2, 1, [257, 70], 2, {}),
    (torch.bfloat16, 64, True, 1, 129, 257, 1, 1, [257], 4, {}),
    (torch.float16, 64, True, 1, 1, 2048, 1, 1, [2000], 0, {}),
    (torch.float16, 128, False, 2, 65, 600, 2, 2, [600, 333], 3,
     dict(window_left=200, window_right=20, softcap=3.0)),
    (torch.bfloat16, 256, True, 2, 1, 300, 2, 2, [257, 100], 3, {}),
]


@pytest.mark.parametrize("dtype, d, causal, b, sq, rows, hq, hkv, seqlens, splits, features",
                         SPLIT_CASES, ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_split_kv(schedule, hopper, dtype, d, causal, b, sq, rows, hq, hkv, seqlens,
                         splits, features):
    q, k, v = qkv(b, sq, rows, hq, hkv, d, dtype)
    # A KV cache's rows past cache_seqlens take no part, whatever they hold.
    for i, n in enumerate(seqlens):
        k[i, n:] = float("nan")
        v[i, n:] = float("inf") if i % 2 else float("nan")
    used = torch.tensor(seqlens, dtype=torch.int32)
    scale = d ** -0.5
    plan = json.loads(hopper.ops.plan_fwd(q, k, v, causal=causal, seqused_k=used, **features,
                                          num_splits=splits, cc_major=9, cc_minor=0,
                                          sm_count=8, smem_optin_bytes=227 * 1024,
                                          hopper_fwd=True))
    assert plan["arch"] == "sm90" and plan["num_splits"] == (splits or 4) and plan["merges"]
    (out, lse), counters = hopper.counted(lambda: hopper.ops.fwd_kvcache(
        q, k, v, cache_seqlens=used, softmax_scale=scale, causal=causal, num_splits=splits,
        **features))
    # The Hopper kernel writes the parts, sm_80's merge combines them.
    kernels = launched(counters)
    assert len(kernels) == 2, kernels
    window = (features.get("window_left", -1), features.get("window_right", -1))
    softcap = features.get("softcap", 0.0)
    assert sm90_kernel(dtype, d, causal, window, softcap) in kernels[0], kernels
    assert "split_merge" in kernels[1]
    # The parts cover the key tiles between them, each once: as many wgmma as unsplit (parts that
    # each ran every tile would merge to the same result, and only this would show it).
    _, unsplit = hopper.counted(lambda: hopper.ops.fwd_kvcache(
        q, k, v, cache_seqlens=used, softmax_scale=scale, causal=causal, num_splits=1,
        **features))
    assert len(launched(unsplit)) == 1
    assert wgmma_instructions(counters) == wgmma_instructions(unsplit) > 0
    ref_kwargs = dict(softmax_scale=scale, causal=causal, window_size=window, softcap=softcap)
    for i, n in enumerate(seqlens):
        check_sequence(f"batch {i}", out[i], lse[i], q[i], k[i, :n], v[i, :n], ref_kwargs)
