"""FP8 (e4m3) decoding through flashattn.flash_attn_with_kvcache, on the shim's H100 opted in:
float8_e4m3fn q, k_cache, v_cache (and new k, v appended in place by kv_append_kernel<e4m3>, a
row copy), FA3's q_descale / k_descale / v_descale, cache_seqlens as the e4m3 kernel's seqused_k,
num_splits through the FP8 plan's split-KV (cuda/plan_fwd_fp8.h, the fp32 parts merged into the
bfloat16 out), packed GQA heads, causal / windows / softcap / ALiBi.

The front end calls torch.ops.flashattn.fwd_kvcache; `kvcache_front_end` points it at
torch.ops.flashattn_sim.fwd_kvcache (the same schema, op glue, checks and plan as on a GPU), so
flash_attn_with_kvcache's own argument handling runs. Outputs are poisoned before the kernels
write them (FLASHATTN_POISON_OUTPUTS, conftest.py).

The reference is tests/fp8_reference.py's (float64 attention of the dequantized
inputs times the descales, P rounded to e4m3 relative to the kernel's running max), over each
sequence's cache_seqlens[b] + seqlen_new keys of the cache as the append leaves it, with the
running max starting anew in each split's part (test_cudasim_hopper_fp8_decode.py split_parts)
for the split count and packing the plan chose (plan_fwd on the same arguments)."""
import math

import pytest
import torch

import flashattn
from hopper_sim import schedule_fixture
from fp8_reference import reference
from test_cudasim_hopper_fp8_call_path import (CAUSAL, D, NO_MASK, check_sequence, descales, fp8,
                                               run_counted)
from test_cudasim_hopper_fp8_decode import MERGE, cta_tokens, loop_name, plan_of, split_parts

schedule = schedule_fixture([("forward", "lazy"), ("reverse", "eager"), ("random:47", "random")])
APPEND = "kv_append_kernel<__nv_fp8_e4m3>"
ALIBI_LOOP = "fwd_sm90_kernel<__nv_fp8_e4m3, 128, {causal}, false, {local}, true, false, false, false>"


@pytest.fixture
def kvcache_front_end(hopper, monkeypatch):
    """flash_attn_with_kvcache calling torch.ops.flashattn_sim.fwd_kvcache."""
    monkeypatch.setattr(torch.ops.flashattn, "fwd_kvcache", hopper.ops.fwd_kvcache)
    return hopper


def appended(cache, new, seqlens):
    """The cache as the append leaves it: new[b] at rows seqlens[b] ... of entry b."""
    want = cache.clone()
    if new is not None:
        for b, length in enumerate(seqlens):
            want[b, length:length + new.shape[1]] = new[b]
    return want


def same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def expected_kernels(window, softcap, alibi, append, merges):
    causal, local = window == CAUSAL, window not in (CAUSAL, NO_MASK)
    loop = (ALIBI_LOOP.format(causal=str(causal).lower(), local=str(local).lower()) if alibi
            else loop_name(window, softcap))
    return [APPEND] * append + [loop] + [MERGE] * merges


def run_decode(sim, window, softcap, alibi, b, sq, s_cache, seqlens, hq, hkv, splits, scales,
               s_new):
    """One flash_attn_with_kvcache call, checked against the reference; returns the plan."""
    q = fp8(b, sq, hq, D)
    k_cache, v_cache = fp8(b, s_cache, hkv, D), fp8(b, s_cache, hkv, D)
    k_new, v_new = (fp8(b, s_new, hkv, D), fp8(b, s_new, hkv, D)) if s_new else (None, None)
    qd, kd, vd = descales(b, hkv, scales == "strided") if scales else (None, None, None)
    slopes = torch.rand(hq) * 0.1 + 0.005 if alibi else None  # far keys still count
    want_k, want_v = appended(k_cache, k_new, seqlens or []), appended(v_cache, v_new, seqlens or [])
    lengths = [s + s_new for s in seqlens] if seqlens is not None else [s_cache] * b
    window_size = NO_MASK if window == CAUSAL else window
    # The plan of the same call (fwd_kvcache's cache_seqlens + seqlen_new is fwd's seqused_k).
    plan = plan_of(sim, q, k_cache, v_cache, num_splits=splits,
                   seqused_k=torch.tensor(lengths, dtype=torch.int32), causal=window == CAUSAL,
                   window_left=window_size[0], window_right=window_size[1], softcap=softcap,
                   alibi_slopes=slopes, q_descale=qd, k_descale=kd, v_descale=vd)
    assert plan["fp8"] and (splits == 0 or plan["num_splits"] == splits)
    # An int cache_seqlens when all are equal (the front end fills the tensor), else int32 [B].
    if seqlens is None:
        cache_seqlens = None
    elif len(set(seqlens)) == 1:
        cache_seqlens = seqlens[0]
    else:
        cache_seqlens = torch.tensor(seqlens, dtype=torch.int32)
    (out, lse), kernels = run_counted(sim, lambda: flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cache_seqlens,
        causal=window == CAUSAL, window_size=window_size, softcap=softcap, alibi_slopes=slopes,
        num_splits=splits, return_softmax_lse=True, q_descale=qd, k_descale=kd, v_descale=vd))
    want = expected_kernels(window, softcap, alibi, s_new > 0, plan["merges"])
    assert len(kernels) == len(want) and all(w in k for w, k in zip(want, kernels)), kernels
    assert same_bytes(k_cache, want_k) and same_bytes(v_cache, want_v), "the append's rows"
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, D)
    assert lse.dtype == torch.float32 and lse.shape == (b, hq, sq)
    for i in range(b):
        per = (lambda x: 1.0 if x is None else x[i])  # noqa: E731
        length = lengths[i]
        parts = split_parts(sq, length, window, True, cta_tokens(plan["packed_heads"]),
                            plan["num_splits"])
        want = reference(q[i], want_k[i, :length], want_v[i, :length], window, True,
                         1 / math.sqrt(D), per(qd), per(kd), per(vd), softcap, tile_part=parts,
                         slopes=slopes)
        check_sequence(out[i], lse[i], want)
    return plan


# (window, softcap, ALiBi, B, Sq, cache rows, cache_seqlens (None: the whole cache), Hq, Hkv,
# num_splits, descales, seqlen_new). Lengths after the append of 1, 7, 63, 64, 65, 127, 128, 129,
# 257; Sq 1 to 7; num_splits 1, 2, 3, more than the key tiles (empty parts), and 0 (the plan's
# count); GQA ratios 1, 2, 3, 4, 8; cache_seqlens shorter than the cache; descales none, plain
# and strided.
DECODES = [
    (NO_MASK, 0.0, False, 2, 1, 300, [257, 129], 4, 1, 3, "strided", 0),
    (CAUSAL, 0.0, False, 3, 1, 300, [0, 62, 256], 4, 1, 2, "strided", 1),
    (CAUSAL, 0.0, False, 2, 7, 160, [58, 120], 4, 2, 0, "plain", 7),
    (NO_MASK, 0.0, False, 1, 1, 257, [7], 8, 1, 5, "plain", 0),
    (CAUSAL, 0.0, False, 1, 1, 1, [0], 2, 1, 2, "strided", 1),
    ((10, 3), 0.7, False, 2, 3, 260, [128, 250], 2, 1, 2, "strided", 2),
    (CAUSAL, 2.0, False, 2, 5, 140, [60, 122], 6, 2, 3, "plain", 5),
    (CAUSAL, 1.0, True, 2, 1, 257, [127, 256], 6, 2, 3, "strided", 1),
    (NO_MASK, 0.0, True, 1, 5, 140, [65], 3, 3, 1, None, 0),
    (NO_MASK, 0.0, False, 2, 2, 129, None, 4, 2, 2, "plain", 0),
    ((-1, 2), 0.0, False, 2, 4, 200, [63, 125], 4, 1, 1, None, 2),
]


@pytest.mark.parametrize("window, softcap, alibi, b, sq, s_cache, seqlens, hq, hkv, splits, "
                         "scales, s_new", DECODES, ids=str)
def test_fp8_kvcache_decode(schedule, kvcache_front_end, window, softcap, alibi, b, sq, s_cache,
                            seqlens, hq, hkv, splits, scales, s_new):
    run_decode(kvcache_front_end, window, softcap, alibi, b, sq, s_cache, seqlens, hq, hkv, splits,
               scales, s_new)


def test_fp8_kvcache_splits_chosen_by_the_plan(schedule, kvcache_front_end):
    """num_splits = 0 on a packed decode long enough to split (17 key tiles on the shim's 8 SMs):
    the plan's count, more than one, merged."""
    plan = run_decode(kvcache_front_end, NO_MASK, 0.0, False, 1, 1, 2100, [2048], 4, 1, 0,
                      "strided", 1)
    assert plan["num_splits"] > 1 and plan["merges"] and plan["packed_heads"] == 4


def test_fp8_kvcache_empty_sequence(kvcache_front_end):
    """A sequence with no key (cache_seqlens 0, nothing appended): out 0, lse -inf, split or not."""
    for splits in (1, 3):
        run_decode(kvcache_front_end, NO_MASK, 0.0, False, 2, 1, 130, [0, 65], 2, 1, splits,
                   "plain", 0)


def test_fp8_kvcache_matches_fwd_with_seqused_k(kvcache_front_end):
    """The kvcache op is fwd over the cache with seqused_k = cache_seqlens: bitwise the same out
    and lse for the same num_splits (fwd_split, the shim's fwd with num_splits)."""
    sim = kvcache_front_end
    q, k, v = fp8(2, 1, 4, D), fp8(2, 200, 1, D), fp8(2, 200, 1, D)
    qd, kd, vd = descales(2, 1, True)
    seqlens = torch.tensor([199, 70], dtype=torch.int32)
    out, lse = flashattn.flash_attn_with_kvcache(
        q, k, v, cache_seqlens=seqlens, causal=True, num_splits=2, return_softmax_lse=True,
        q_descale=qd, k_descale=kd, v_descale=vd)
    out2, lse2 = sim.ops.fwd_split(q, k, v, causal=True, seqused_k=seqlens, num_splits=2,
                                   q_descale=qd, k_descale=kd, v_descale=vd)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
