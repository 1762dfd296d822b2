"""The FP8 (e4m3) forward's decode features as the library runs them, on the shim's H100 opted in:
split-KV (the e4m3 loops write each split's fp32 O / l and LSE, split_merge_kernel.cuh writes the
bfloat16 out) and packed GQA heads (a decode's query heads of one kv head as the rows of one
tile, gqa_decode.h), both planned by cuda/plan_fwd_fp8.h as the 16-bit sm_90a plan decides them.

fwd takes no num_splits (fwd_kvcache does, over a dense cache: test_cudasim_hopper_fp8_kvcache.py),
so the split tests call torch.ops.flashattn_sim.fwd_split: fwd's arguments and op glue with
num_splits added, for what fwd_kvcache does not take (top-left, varlen, prefill shapes). The packed
tests call flash_attn_func, whose decoding calls the plan packs by itself.

The reference is test_cudasim_hopper_fp8_call_path.py's (float64 attention of the dequantized
inputs, P rounded to e4m3 relative to the kernel's running max, the same tolerances), with the
running max starting anew in each split's part of a CTA's key tiles (split_parts below: the
kernel's KeyTiles and split_part, mask.h, in Python)."""
import json
import math

import pytest
import torch

import flashattn
from hopper_sim import schedule_fixture
from test_cudasim_hopper_fp8_call_path import (BLOCK_N, CAUSAL, D, LOOP, NO_MASK, check_sequence,
                                               dense_inputs, reference, run_counted,
                                               sim_front_ends,  # noqa: F401
                                               varlen_inputs)

schedule = schedule_fixture([("forward", "lazy"), ("reverse", "eager"), ("random:31", "random")])
MERGE = "split_merge"  # the merge kernel's name, after the e4m3 loop's


def split_parts(sq, sk, window, bottom_right, cta_tokens, num_splits):
    """The split part (0 .. num_splits - 1) of each key tile of each query row ([Sq, tiles]; -1
    for a tile its CTA does not visit, which the row does not see): the CTA of cta_tokens
    query tokens (128; with packed heads 2 x floor(64 / g)) visits the tiles [lo, hi) that any
    of its rows sees (fwd_sm90_mask.cuh KeyTiles) and cuts them into num_splits contiguous parts
    (split_kv.h split_part)."""
    tiles = max((sk + BLOCK_N - 1) // BLOCK_N, 1)
    offset = sk - sq if bottom_right else 0
    left, right = window
    part = torch.full((sq, tiles), -1, dtype=torch.int64)
    for m0 in range(0, sq, cta_tokens):
        row_end = min(m0 + cta_tokens, sq)
        lo, hi = 0, (sk + BLOCK_N - 1) // BLOCK_N
        if right >= 0:
            last = row_end + offset + right
            hi = min(max(0 if last <= 0 else (last + BLOCK_N - 1) // BLOCK_N, 0), hi)
        if left >= 0:
            first = m0 + offset - left
            lo = 0 if first <= 0 else first // BLOCK_N
        lo = min(lo, hi)
        n = hi - lo
        for s in range(num_splits):
            begin, end = lo + n * s // num_splits, lo + n * (s + 1) // num_splits
            part[m0:row_end, begin:end] = s
    return part


def cta_tokens(g):
    """Query tokens per CTA: 128, or with g packed heads 2 consumers x floor(64 / g)."""
    return 128 if g == 1 else 2 * (64 // g)


def plan_of(sim, *args, **kwargs):
    return json.loads(sim.ops.plan_fwd(*args, cc_major=9, hopper_fwd=True, **kwargs))


def check_batch(q, k, v, qd, kd, vd, out, lse, window, bottom_right, softcap, splits, packed):
    b, sq = q.shape[:2]
    for i in range(b):
        per = (lambda x: 1.0 if x is None else x[i])  # noqa: E731
        parts = split_parts(sq, k.shape[1], window, bottom_right, cta_tokens(packed), splits)
        want = reference(q[i], k[i], v[i], window, bottom_right, 1 / math.sqrt(D), per(qd),
                         per(kd), per(vd), softcap, tile_part=parts)
        check_sequence(out[i], lse[i], want)


def loop_name(window, softcap):
    return LOOP.format(causal=str(window == CAUSAL).lower(), softcap=str(softcap > 0).lower(),
                       local=str(window not in (CAUSAL, NO_MASK)).lower())


# Split-KV: (window, bottom-right?, softcap, B, Sq, Sk, Hq, Hkv, num_splits, descales). Decodes
# (Sq 1 and 7, packed as well), prefill shapes, more splits than key tiles (empty parts: 0 and
# -inf, which the merge weighs by 0), one key, windows and softcap.
SPLITS = [
    (NO_MASK, True, 0.0, 2, 1, 257, 4, 1, 3, "strided"),
    (CAUSAL, True, 0.0, 2, 7, 257, 4, 2, 2, "plain"),
    (NO_MASK, True, 0.0, 2, 65, 129, 2, 1, 2, None),
    (CAUSAL, False, 0.0, 1, 129, 257, 2, 2, 3, "strided"),
    (CAUSAL, True, 0.0, 1, 257, 129, 1, 1, 2, "plain"),
    (NO_MASK, True, 0.0, 1, 7, 65, 2, 1, 3, "plain"),
    (CAUSAL, True, 0.0, 2, 1, 1, 4, 1, 2, "strided"),
    ((10, 3), True, 0.7, 1, 65, 257, 2, 1, 2, "strided"),
    ((-1, 5), True, 2.0, 1, 7, 257, 4, 2, 3, "plain"),
]


@pytest.mark.parametrize("window, bottom_right, softcap, b, sq, sk, hq, hkv, splits, scales",
                         SPLITS, ids=lambda x: str(x))
def test_fp8_split_kv(schedule, hopper, window, bottom_right, softcap, b, sq, sk, hq, hkv, splits,
                      scales):
    q, k, v, qd, kd, vd = dense_inputs(b, sq, sk, hq, hkv, False, scales)
    args = dict(window_left=window[0], window_right=window[1], softcap=softcap,
                align_bottom_right=bottom_right, q_descale=qd, k_descale=kd, v_descale=vd)
    plan = plan_of(hopper, q, k, v, num_splits=splits, **args)
    assert plan["fp8"] and plan["num_splits"] == splits and plan["merges"]
    packed = plan["packed_heads"]
    (out, lse), kernels = run_counted(hopper, lambda: hopper.ops.fwd_split(
        q, k, v, num_splits=splits, **args))
    assert len(kernels) == 2 and loop_name(window, softcap) in kernels[0] and MERGE in kernels[1], \
        kernels
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, D)
    check_batch(q, k, v, qd, kd, vd, out, lse, window, bottom_right, softcap, splits, packed)


def test_fp8_split_kv_chosen_by_the_plan(schedule, hopper):
    """num_splits = 0: the split model's count on the e4m3 kernel's shape (the shim's 8 SMs), for a
    packed decode long enough to split (17 key tiles: 4 splits)."""
    q, k, v, qd, kd, vd = dense_inputs(1, 1, 2049, 4, 1, True, "strided")
    args = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    plan = plan_of(hopper, q, k, v, num_splits=0, **args)
    splits = plan["num_splits"]
    assert splits > 1 and plan["packed_heads"] == 4
    (out, lse), kernels = run_counted(hopper, lambda: hopper.ops.fwd_split(
        q, k, v, num_splits=0, **args))
    assert len(kernels) == 2 and MERGE in kernels[1], kernels
    check_batch(q, k, v, qd, kd, vd, out, lse, NO_MASK, True, 0.0, splits, 4)


@pytest.mark.parametrize("causal, lens_q, lens_k, splits", [
    (False, [65, 1, 130], [129, 7, 200], 2),
    (True, [7, 0, 129], [257, 5, 60], 3),
], ids=str)
def test_fp8_varlen_split_kv(schedule, hopper, causal, lens_q, lens_k, splits):
    """Varlen: the scratch is filled first (rows past every sequence merge to 0 and -inf)."""
    b, hq, hkv = len(lens_q), 2, 1
    cu_q, cu_k, q, k, v, qd, kd, vd = varlen_inputs(lens_q, lens_k, hq, hkv)
    (out, lse), kernels = run_counted(hopper, lambda: hopper.ops.fwd_split(
        q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
        max_seqlen_k=max(lens_k), num_splits=splits, q_descale=qd, k_descale=kd, v_descale=vd))
    assert len(kernels) == 2 and MERGE in kernels[1], kernels
    window = CAUSAL if causal else NO_MASK
    for i in range(b):
        rq, rk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        parts = split_parts(lens_q[i], lens_k[i], window, True, 128, splits)
        want = reference(q[rq], k[rk], v[rk], window, True, 1 / math.sqrt(D), qd[i], kd[i],
                         vd[i], tile_part=parts)
        check_sequence(out[rq], lse[:, rq], want)
    assert (out[int(cu_q[-1]):] == 0).all() and (lse[:, int(cu_q[-1]):] == float("-inf")).all()


# Packed GQA decode through flash_attn_func: (window, softcap, B, Sq, Sk, Hq, Hkv, descales).
# g = 4, 2, 8 and 3 (64 % 3 != 0: Q in two boxes a CTA), Sk from 1 to 257, windows and softcap;
# Sq = 65 at g = 2 is not packed (3 tiles of 64 rows against 2 heads), as for 16 bits.
PACKED = [
    (NO_MASK, 0.0, 2, 1, 257, 4, 1, "strided"),
    (CAUSAL, 0.0, 2, 7, 129, 4, 2, "plain"),
    (CAUSAL, 0.0, 1, 1, 1, 4, 1, "strided"),
    ((5, 2), 0.7, 1, 7, 257, 8, 1, "plain"),
    (CAUSAL, 2.0, 2, 5, 65, 6, 2, "strided"),
    (NO_MASK, 0.0, 1, 65, 63, 4, 2, None),
]


@pytest.mark.parametrize("window, softcap, b, sq, sk, hq, hkv, scales", PACKED, ids=str)
def test_fp8_packed_gqa_decode(schedule, sim_front_ends, window, softcap, b, sq, sk, hq, hkv,
                               scales):
    sim = sim_front_ends
    q, k, v, qd, kd, vd = dense_inputs(b, sq, sk, hq, hkv, True, scales)
    g = hq // hkv
    # The 16-bit sm_90a plan's decision on the same shapes.
    plan16 = plan_of(sim, *(t.to(torch.bfloat16) for t in (q, k, v)), causal=window == CAUSAL,
                     window_left=-1 if window == CAUSAL else window[0],
                     window_right=-1 if window == CAUSAL else window[1], softcap=softcap)
    plan = plan_of(sim, q, k, v, causal=window == CAUSAL,
                   window_left=-1 if window == CAUSAL else window[0],
                   window_right=-1 if window == CAUSAL else window[1], softcap=softcap,
                   q_descale=qd, k_descale=kd, v_descale=vd)
    assert plan16["arch"] == "sm90" and plan["packed_heads"] == plan16["packed_heads"]
    packed = plan["packed_heads"]
    assert packed == (g if math.ceil(sq * g / 64) < g else 1)  # gqa_decode.h's rule
    assert plan["grid"] == [(sq + cta_tokens(packed) - 1) // cta_tokens(packed),
                            hkv if packed > 1 else hq, b]
    (out, lse, _), kernels = run_counted(sim, lambda: flashattn.flash_attn_func(
        q, k, v, causal=window == CAUSAL, window_size=NO_MASK if window == CAUSAL else window,
        softcap=softcap, return_attn_probs=True, q_descale=qd, k_descale=kd, v_descale=vd))
    assert len(kernels) == 1 and loop_name(window, softcap) in kernels[0], kernels
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, D)
    assert lse.shape == (b, hq, sq)
    check_batch(q, k, v, qd, kd, vd, out, lse, window, True, softcap, 1, packed)


def test_fp8_group_above_64_heads_runs_unpacked(hopper):
    """65 query heads per kv head: the 16-bit plan packs them for sm_80's kernels, which FP8 has
    not; the e4m3 kernel's tile holds at most 64, so FP8 runs them unpacked."""
    q, k, v, qd, kd, vd = dense_inputs(1, 1, 7, 65, 1, False, "plain")
    plan = plan_of(hopper, q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    assert plan["packed_heads"] == 1 and plan["grid"] == [1, 65, 1]
    out, lse = hopper.ops.fwd(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    check_batch(q, k, v, qd, kd, vd, out, lse, NO_MASK, True, 0.0, 1, 1)
