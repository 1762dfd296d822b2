"""FP8 (e4m3) decoding over a paged, indexed or left-padded KV cache through
flashattn.flash_attn_with_kvcache, on the shim's H100 opted in: the e4m3 kernel's gathering
producer (csrc/cuda/hopper/fwd_sm90_gather.cuh gather_kv_tile<..., uint8_t>: one 128-byte swizzled
row per key at d = 128) and its V^T transpose of the gathered V tile (fwd_sm90_kernel.cuh
transpose_gathered_v).

Each call's caches are filled with e4m3 NaN first, then each sequence's keys are written where
the layout puts them (pages of a shuffled block table, the entry cache_batch_idx names, after a
left pad), so a row read from the wrong place, or a row past the sequence that is not zeroed,
turns out NaN. Checked per sequence:
- the append (k, v new rows) wrote exactly the rows the layout gives, and nothing else;
- out and lse against tests/fp8_reference.py's float64 reference of the sequence's keys, for the
  split count and packing the plan chose (plan_fwd on the same arguments where fwd takes them);
- the same call over the same keys in a dense cache (the TMA-loaded loops, already checked
  against the reference) gives the same bits of out and lse;
- the gathered loop is the one that ran.
Outputs are poisoned before the kernels write them (FLASHATTN_POISON_OUTPUTS, conftest.py)."""
import math

import pytest
import torch

import flashattn
from fp8_reference import FP8, reference
from hopper_sim import schedule_fixture
from test_cudasim_hopper_fp8_call_path import (CAUSAL, D, NO_MASK, check_sequence, descales, fp8,
                                               run_counted)
from test_cudasim_hopper_fp8_decode import MERGE, cta_tokens, plan_of, split_parts
from test_cudasim_hopper_fp8_kvcache import APPEND, kvcache_front_end  # noqa: F401 (fixture)

schedule = schedule_fixture([("forward", "lazy"), ("reverse", "eager"), ("random:47", "random")])
GATHERED = ("fwd_sm90_kernel<__nv_fp8_e4m3, 128, {causal}, false, {local}, false, false, true, "
            "false>")
NAN = 0x7F  # an e4m3fn NaN byte


def nan_cache(*shape):
    return torch.full(shape, NAN, dtype=torch.uint8).view(FP8)


class Layout:
    """Where sequence b's logical key j lives: a paged cache (page_size, a shuffled block table
    with spare pages), an indexed one (cache_batch_idx: a permutation of more entries than
    sequences) and / or a left pad (cache_leftpad: key j at row pad[b] + j)."""

    def __init__(self, b, hkv, capacity, page_size=0, indexed=False, leftpad=False):
        self.b, self.page_size = b, page_size
        self.pads = [int(x) for x in torch.randint(0, 40, (b,))] if leftpad else [0] * b
        if page_size:
            blocks = -(-capacity // page_size)
            pages = b * blocks + 3
            self.table = torch.randperm(pages, dtype=torch.int32)[:b * blocks].view(b, blocks)
            self.shape = (pages, page_size, hkv, D)
            self.index = None
        else:
            entries = b + 2 if indexed else b
            self.index = torch.randperm(entries, dtype=torch.int32)[:b] if indexed else None
            self.table = None
            self.shape = (entries, capacity + max(self.pads), hkv, D)

    def rows(self, cache, i, n):
        """Sequence i's logical keys 0 .. n - 1 of `cache` (a view of its rows)."""
        if self.page_size:
            return cache[self.table[i].long()].flatten(0, 1)[:n]
        entry = int(self.index[i]) if self.index is not None else i
        return cache[entry, self.pads[i]:self.pads[i] + n]

    def write(self, cache, i, rows, start=0):
        """Sets sequence i's logical keys start, start + 1, ... to rows."""
        for j in range(rows.shape[0]):
            key = start + j
            if self.page_size:
                page = int(self.table[i, key // self.page_size])
                cache[page, key % self.page_size] = rows[j]
            else:
                entry = int(self.index[i]) if self.index is not None else i
                cache[entry, self.pads[i] + key] = rows[j]

    def kwargs(self, lengths):
        """flash_attn_with_kvcache's layout arguments; cache_seqlens counts the pad."""
        out = dict(cache_seqlens=torch.tensor([n + p for n, p in zip(lengths, self.pads)],
                                              dtype=torch.int32))
        if self.table is not None:
            out["block_table"] = self.table
        if self.index is not None:
            out["cache_batch_idx"] = self.index
        if any(self.pads):
            out["cache_leftpad"] = torch.tensor(self.pads, dtype=torch.int32)
        return out


def same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def run_paged(sim, layout_args, window, b, sq, lengths, hq, hkv, splits, scales, s_new):
    """One flash_attn_with_kvcache call on a gathered FP8 cache, checked as the module says."""
    capacity = max(lengths) + s_new + 5
    layout = Layout(b, hkv, capacity, **layout_args)
    logical_k = [fp8(n, hkv, D) for n in lengths]
    logical_v = [fp8(n, hkv, D) for n in lengths]
    k_cache, v_cache = nan_cache(*layout.shape), nan_cache(*layout.shape)
    for i in range(b):
        layout.write(k_cache, i, logical_k[i])
        layout.write(v_cache, i, logical_v[i])
    q = fp8(b, sq, hq, D)
    k_new, v_new = (fp8(b, s_new, hkv, D), fp8(b, s_new, hkv, D)) if s_new else (None, None)
    qd, kd, vd = descales(b, hkv, scales == "strided") if scales else (None, None, None)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    if s_new:
        for i in range(b):
            layout.write(want_k, i, k_new[i], lengths[i])
            layout.write(want_v, i, v_new[i], lengths[i])
    total = [n + s_new for n in lengths]
    window_size = NO_MASK if window == CAUSAL else window
    causal = window == CAUSAL
    dense_k, dense_v = nan_cache(b, capacity, hkv, D), nan_cache(b, capacity, hkv, D)
    for i in range(b):
        dense_k[i, :lengths[i]], dense_v[i, :lengths[i]] = logical_k[i], logical_v[i]
    # The plan: fwd on the paged cache where fwd takes the layout (block_table), else on the
    # dense one; the same lengths and q, so the same packing (and split count, given).
    plan_kv = (k_cache, v_cache, dict(block_table=layout.table)) if layout.page_size and \
        not any(layout.pads) else (dense_k, dense_v, {})
    plan = plan_of(sim, q, plan_kv[0], plan_kv[1], num_splits=splits,
                   seqused_k=torch.tensor(total, dtype=torch.int32), causal=causal,
                   window_left=window_size[0], window_right=window_size[1], q_descale=qd,
                   k_descale=kd, v_descale=vd, **plan_kv[2])
    assert plan["fp8"] and (splits == 0 or plan["num_splits"] == splits)
    call = dict(causal=causal, window_size=window_size, return_softmax_lse=True, q_descale=qd,
                k_descale=kd, v_descale=vd)
    (out, lse), kernels = run_counted(sim, lambda: flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, num_splits=splits, **layout.kwargs(lengths),
        **call))
    loop = GATHERED.format(causal=str(causal).lower(),
                           local=str(window not in (CAUSAL, NO_MASK)).lower())
    want = [APPEND] * (s_new > 0) + [loop] + [MERGE] * plan["merges"]
    assert len(kernels) == len(want) and all(w in k for w, k in zip(want, kernels)), kernels
    assert same_bytes(k_cache, want_k) and same_bytes(v_cache, want_v), "the append's rows"
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, D)
    for i in range(b):
        per = (lambda x: 1.0 if x is None else x[i])  # noqa: E731
        parts = split_parts(sq, total[i], window, True, cta_tokens(plan["packed_heads"]),
                            plan["num_splits"])
        keys, values = layout.rows(want_k, i, total[i]), layout.rows(want_v, i, total[i])
        expected = reference(q[i], keys, values, window, True, 1 / math.sqrt(D), per(qd), per(kd),
                             per(vd), tile_part=parts)
        check_sequence(out[i], lse[i], expected)
    # The dense cache's TMA loops on the same keys and split count: the same bits.
    out2, lse2 = flashattn.flash_attn_with_kvcache(
        q, dense_k, dense_v, k=k_new, v=v_new, num_splits=plan["num_splits"],
        cache_seqlens=torch.tensor(lengths, dtype=torch.int32), **call)
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16)) and torch.equal(lse, lse2), \
        "the gathered cache and the dense cache differ"
    return plan


# (layout, window, B, Sq, cache_seqlens before the append, Hq, Hkv, num_splits, descales,
# seqlen_new). Page sizes 1, 16, 48 (dividing neither key tile nor a power of two) and 256;
# cache_batch_idx permutations; left pads (with and without an index); lengths after the append
# 1, 7, 63, 65, 127, 129, 257 and an empty sequence; Sq 1 to 7; packed GQA decodes (4:1, 8:1),
# unpacked MHA; num_splits 0 (the plan's), 1 and 3; no mask, causal and a local window.
CASES = [
    (dict(page_size=1), CAUSAL, 2, 1, [62, 128], 4, 1, 3, "strided", 1),
    (dict(page_size=16), CAUSAL, 3, 1, [0, 6, 256], 8, 1, 0, "plain", 1),
    (dict(page_size=16), NO_MASK, 2, 7, [129, 58], 4, 2, 1, "strided", 7),
    (dict(page_size=48), CAUSAL, 2, 3, [200, 64], 2, 2, 3, "plain", 1),
    (dict(page_size=256), (40, 0), 2, 2, [300, 125], 4, 1, 1, "strided", 2),
    (dict(indexed=True), CAUSAL, 3, 1, [126, 0, 62], 4, 1, 3, "strided", 1),
    (dict(indexed=True), NO_MASK, 2, 5, [60, 200], 2, 2, 0, None, 3),
    (dict(leftpad=True), CAUSAL, 2, 1, [128, 63], 4, 2, 1, "plain", 1),
    (dict(leftpad=True, indexed=True), (10, 3), 2, 4, [190, 61], 2, 1, 3, "strided", 4),
]


@pytest.mark.parametrize("layout, window, b, sq, lengths, hq, hkv, splits, scales, s_new", CASES,
                         ids=str)
def test_fp8_gathered_kvcache_decode(schedule, kvcache_front_end, layout, window, b, sq, lengths,
                                     hq, hkv, splits, scales, s_new):
    run_paged(kvcache_front_end, layout, window, b, sq, lengths, hq, hkv, splits, scales, s_new)


def test_fp8_paged_decode_split_by_the_plan(kvcache_front_end):
    """num_splits = 0 on a packed decode long enough to split (17 key tiles on the shim's 8 SMs),
    in pages of 16: the plan's count, more than one, merged."""
    plan = run_paged(kvcache_front_end, dict(page_size=16), NO_MASK, 1, 1, [2100], 4, 1, 0,
                     "strided", 1)
    assert plan["num_splits"] > 1 and plan["merges"] and plan["packed_heads"] == 4


@pytest.mark.parametrize("what, extra", [
    ("softcap", dict(softcap=5.0)),
    ("alibi_slopes", dict(alibi_slopes=torch.full((2,), 0.1))),
    ("rotary_cos", dict(rotary_cos=torch.ones(300, 64), rotary_sin=torch.zeros(300, 64))),
])
def test_what_the_gathered_fp8_loops_lack_is_refused(kvcache_front_end, what, extra):
    """Softcap and ALiBi with a paged FP8 cache (no such loop) and rotary (FP8 caches take none)
    are refused by name, the cache left as it was."""
    layout = Layout(1, 1, 256, page_size=16)
    k_cache, v_cache = fp8(*layout.shape), fp8(*layout.shape)
    before = k_cache.clone()
    k_new = fp8(1, 1, 1, D)
    with pytest.raises(RuntimeError, match=what):
        flashattn.flash_attn_with_kvcache(fp8(1, 1, 2, D), k_cache, v_cache, k=k_new, v=k_new,
                                          causal=True, **layout.kwargs([100]), **extra)
    assert same_bytes(k_cache, before)


@pytest.mark.parametrize("page_size", [0, 16])
def test_an_unaligned_fp8_cache_is_refused_before_the_append(kvcache_front_end, page_size):
    """A cache whose heads are 136 elements apart (a view of wider rows: shared checks pass, the
    e4m3 kernel's 16-byte TMA / cp.async reads do not) is refused by the FP8 plan, and the
    refusal comes before the append: the cache keeps its bytes."""
    layout = Layout(1, 2, 256, page_size=page_size)
    wide = layout.shape[:-1] + (D + 8,)
    k_cache, v_cache = (fp8(*wide)[..., :D] for _ in range(2))
    k_before, v_before = k_cache.clone(), v_cache.clone()
    k_new, v_new = fp8(1, 1, 2, D), fp8(1, 1, 2, D)
    with pytest.raises(RuntimeError, match="16-byte aligned"):
        flashattn.flash_attn_with_kvcache(fp8(1, 1, 4, D), k_cache, v_cache, k=k_new, v=v_new,
                                          causal=True, **layout.kwargs([100]))
    assert same_bytes(k_cache.contiguous(), k_before) and same_bytes(v_cache.contiguous(), v_before)


@pytest.mark.parametrize("page_size", [16, 48])
def test_fp8_fwd_with_a_block_table(schedule, kvcache_front_end, page_size):
    """torch.ops.flashattn.fwd (flash_attn_func's op) with a block_table and seqused_k: the gathered
    loop, the same bits as fwd over the same keys in a dense [B, Sk, Hkv, D] k, v."""
    sim = kvcache_front_end
    b, sq, hq, hkv, lengths = 2, 3, 4, 2, [150, 61]
    layout = Layout(b, hkv, 160, page_size=page_size)
    k_cache, v_cache = nan_cache(*layout.shape), nan_cache(*layout.shape)
    dense_k, dense_v = nan_cache(b, 160, hkv, D), nan_cache(b, 160, hkv, D)
    for i, n in enumerate(lengths):
        keys, values = fp8(n, hkv, D), fp8(n, hkv, D)
        layout.write(k_cache, i, keys)
        layout.write(v_cache, i, values)
        dense_k[i, :n], dense_v[i, :n] = keys, values
    q = fp8(b, sq, hq, D)
    qd, kd, vd = descales(b, hkv, True)
    used = torch.tensor(lengths, dtype=torch.int32)
    args = dict(causal=True, seqused_k=used, q_descale=qd, k_descale=kd, v_descale=vd)
    (out, lse), kernels = run_counted(sim, lambda: sim.ops.fwd(q, k_cache, v_cache,
                                                               block_table=layout.table, **args))
    loop = GATHERED.format(causal="true", local="false")
    assert len(kernels) == 1 and loop in kernels[0], kernels
    out2, lse2 = sim.ops.fwd(q, dense_k, dense_v, **args)
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16)) and torch.equal(lse, lse2)
    for i, n in enumerate(lengths):
        want = reference(q[i], dense_k[i, :n], dense_v[i, :n], CAUSAL, True, 1 / math.sqrt(D),
                         qd[i], kd[i], vd[i])
        check_sequence(out[i], lse[i], want)
