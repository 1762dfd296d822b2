"""The sm_90a forward through the library on a GPU (tools/gpu_check.sh, step hopper-lib):
torch.ops.flashattn.fwd with FLASHATTN_CUDA_HOPPER=1, which the plan (csrc/cuda/plan_fwd_sm90.h)
sends to the Hopper kernels on compute capability 9.0.

    FLASHATTN_CUDA_HOPPER=1 python tests/cudasim/hopper_library_sample.py

For each case: out and lse against the float64 reference within 2x PyTorch's own error in the
dtype (tests/checks.check_forward, outputs poisoned first), and the profiler's kernel names show
that the Hopper kernel ran (fwd_sm90_kernel), or, for a call it does not take (a softmax
scale <= 0), that the sm_80 kernel did; split-KV decodes (fwd_kvcache) also run the
split merge; paged and indexed KV caches run the gathering producer (test_kvcache.Case), and
GQA decodes run packed (the query heads of a kv head as one CTA's rows), FP8 ones too; the FP8
loops run windows, softcap, ALiBi and attn_mask (tests/fp8_reference.py on the CPU), and FP8
decodes through flash_attn_with_kvcache append e4m3 rows and split the keys (num_splits). Then
the library's forward TFLOP/s at B·N = 16k, hidden 2048, d = 128, N = 4096, causal and not.
Exits 1 on any failure; on a GPU other than compute capability 9.0, prints SKIP and exits 0.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE)))  # tests/: checks, tolerance
os.environ.setdefault("FLASHATTN_POISON_OUTPUTS", "1")  # before flashattn loads

import torch  # noqa: E402

from library_sample import assert_ran, kernels_run, run_sample, tflops  # noqa: E402


# (dtype, d, mask, B, Sq, Sk, Hq, Hkv): both dtypes and head dims, causal in both alignments,
# ragged lengths, Sq != Sk both ways, GQA, one query, a long sequence.
CASES = [
    (torch.bfloat16, 128, "none", 2, 1000, 1000, 8, 8),
    (torch.float16, 64, "none", 1, 65, 129, 4, 1),
    (torch.bfloat16, 64, "causal", 2, 129, 63, 2, 2),
    (torch.float16, 128, "causal", 1, 7, 2049, 4, 2),
    (torch.bfloat16, 128, "causal_top_left", 1, 513, 257, 3, 1),
    (torch.float16, 64, "causal_top_left", 1, 1, 1, 1, 1),
    (torch.bfloat16, 128, "causal", 1, 2048, 2048, 4, 4),
    (torch.bfloat16, 128, "softcap_causal", 1, 1000, 1000, 4, 4),
    (torch.float16, 64, "window", 2, 777, 1500, 4, 2),
    (torch.bfloat16, 128, "window_causal", 1, 600, 2000, 2, 1),
    (torch.float16, 128, "alibi_batch_causal", 2, 1000, 1000, 4, 4),
    # d = 256 (128 x 64 tiles): each main loop kind.
    (torch.bfloat16, 256, "none", 2, 1000, 1000, 4, 2),
    (torch.float16, 256, "causal", 1, 777, 1029, 2, 2),
    (torch.bfloat16, 256, "window", 1, 600, 1500, 2, 1),
    (torch.bfloat16, 256, "softcap_causal", 1, 513, 513, 2, 2),
    (torch.float16, 256, "alibi_batch_causal", 2, 300, 300, 2, 2),
    # Softcap with a window at d = 256: softcap's window loop (lean S descriptors) and ALiBi's
    # window loop with softcap at run time.
    (torch.float16, 256, "softcap_window", 1, 1000, 1500, 4, 2),
    (torch.bfloat16, 256, "alibi_softcap_window_top_left", 2, 513, 300, 2, 2),
]
# checks.MASKS and the windows of the d = 256 softcap cases above.
EXTRA_MASKS = {
    "softcap_window": dict(softcap=2.5, window=(200, 70)),
    "alibi_softcap_window_top_left": dict(alibi="heads", softcap=1.5, window=(100, 30),
                                          align_bottom_right=False),
}


def check_cases(tally):
    from checks import MASKS, check_forward
    from executors import make_executor

    cuda = make_executor("cuda")
    for dtype, d, mask, b, sq, sk, hq, hkv in CASES:
        name = f"{str(dtype)[6:]} d={d} {mask} B={b} Sq={sq} Sk={sk} Hq={hq} Hkv={hkv}"
        q = torch.randn(b, sq, hq, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
        with tally.case(name):
            spec = dict(MASKS, **EXTRA_MASKS)[mask]
            names = kernels_run(lambda: check_forward(cuda, q, k, v, spec))
            assert_ran(names, "fwd_sm90_kernel", "Hopper kernel")
    # A call the Hopper forward does not take stays on sm_80 (README's support table): a
    # softmax scale <= 0 (ALiBi + softcap + a window, once the example, runs on Hopper now).
    q, k, v = (torch.randn(1, 200, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    with tally.case("a negative softmax scale stays on sm_80"):
        names = kernels_run(lambda: check_forward(cuda, q, k, v, MASKS["negative_scale"]))
        assert not any("fwd_sm90_kernel" in n for n in names) and any(
            "fwd_kernel_16bit" in n for n in names), f"expected the sm_80 kernel, ran {names}"
    check_attn_mask_cases(tally)
    check_split_cases(tally)
    check_paged_cases(tally)
    check_packed_cases(tally)
    check_fp8_packed_cases(tally)
    check_fp8_feature_cases(tally)
    check_fp8_kvcache_cases(tally)


# attn_mask (the kAttnMask main loops): (dtype, d, kind, mask shape, causal, B, Sq, Sk, Hq, Hkv);
# a bool key-padding mask, a float32 [Sq, Sk] one with causal, a 16-bit per-head one; at d = 256
# (its mask loops with lean S descriptors) a 16-bit per-head one and a bool [Sq, Sk] one with causal.
# test_attn_mask.check_masked compares out and lse with the float64 reference (top-left causal).
MASK_CASES = [
    (torch.bfloat16, 128, "bool", (2, 1, 1, 1500), False, 2, 1000, 1500, 4, 2),
    (torch.float16, 64, "float32", (777, 777), True, 1, 777, 777, 4, 4),
    (torch.bfloat16, 128, "16bit", (1, 2, 300, 513), False, 1, 300, 513, 2, 1),
    (torch.float16, 256, "16bit", (1, 2, 300, 513), False, 1, 300, 513, 2, 1),
    (torch.bfloat16, 256, "bool", (777, 777), True, 1, 777, 777, 2, 2),
]


def check_attn_mask_cases(tally):
    from executors import make_executor
    from test_attn_mask import check_masked, make_mask

    cuda = make_executor("cuda")
    for dtype, d, kind, shape, causal, b, sq, sk, hq, hkv in MASK_CASES:
        name = f"attn_mask {kind} {shape} {str(dtype)[6:]} d={d} causal={causal} Sq={sq} Sk={sk}"
        q = torch.randn(b, sq, hq, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
        mask = make_mask("bool" if kind == "bool" else "float", shape,
                         torch.float32 if kind == "float32" else dtype, "cuda")
        if causal:  # top-left causal folded into the mask, as check_masked takes none
            mask = mask.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device="cuda").triu(1),
                                    False if kind == "bool" else float("-inf"))
        with tally.case(name):
            names = kernels_run(lambda: check_masked(cuda, q, k, v, mask, scale=d ** -0.5,
                                                     backward=False))
            assert_ran(names, "fwd_sm90_kernel", "Hopper kernel")


# Split-KV decodes through flash_attn_with_kvcache's op (cache_seqlens): (dtype, d, causal, B,
# Sq, cache rows, H, cache_seqlens, num_splits); 0 is the Hopper plan's own count.
SPLIT_CASES = [
    (torch.bfloat16, 128, True, 3, 1, 4096, 8, [4096, 0, 1000], 0),
    (torch.float16, 64, False, 2, 1, 777, 4, [777, 129], 3),
    (torch.bfloat16, 128, True, 1, 200, 3000, 2, [2999], 4),
    (torch.bfloat16, 256, True, 2, 1, 4096, 4, [4096, 333], 0),
]


def check_split_cases(tally):
    from checks import to64
    from flashattn._reference import attention_reference
    from tolerance import assert_within_torch_error

    for dtype, d, causal, b, sq, rows, h, seqlens, splits in SPLIT_CASES:
        name = f"split-KV {str(dtype)[6:]} d={d} causal={causal} B={b} Sq={sq} seqlens={seqlens}"
        q = torch.randn(b, sq, h, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(b, rows, h, d, dtype=dtype, device="cuda") for _ in range(2))
        for i, n in enumerate(seqlens):  # rows past cache_seqlens take no part
            k[i, n:] = float("nan")
            v[i, n:] = float("nan")
        used = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
        result = []
        with tally.case(name):
            names = kernels_run(lambda: result.append(torch.ops.flashattn.fwd_kvcache(
                q, k, v, cache_seqlens=used, causal=causal, num_splits=splits)))
            assert_ran(names, "fwd_sm90_kernel", "Hopper kernel")
            assert_ran(names, "split_merge", "split merge")
            out, lse = result[0]
            for i, n in enumerate(seqlens):
                if n == 0:
                    assert (out[i] == 0).all() and (lse[i] == float("-inf")).all(), f"batch {i}"
                    continue
                qi, ki, vi = q[i:i + 1].cpu(), k[i:i + 1, :n].cpu(), v[i:i + 1, :n].cpu()
                ref_out, ref_lse = attention_reference(to64(qi), to64(ki), to64(vi), causal=causal)
                low_out, low_lse = attention_reference(qi, ki, vi, causal=causal)
                assert_within_torch_error(f"out[{i}]", out[i:i + 1].cpu(), ref_out, low_out)
                assert_within_torch_error(f"lse[{i}]", lse[i:i + 1].cpu(), ref_lse,
                                          low_lse.float())


# Paged and indexed KV caches (the gathering producer, kGatherKv): test_kvcache.Case arguments.
# GQA decodes are packed (PACKED_CASES below); GQA here comes with 65 query rows (2 per kv head:
# more row tiles than the group, so not packed).
PAGED_CASES = [
    ("paged decode, page 16, d=128, causal, 4k cache", dict(
        page_size=16, batch=4, heads=8, heads_kv=8, head_dim=128, seqlen_cache=4000)),
    ("paged chunk, page 256, GQA, d=128, 65 queries", dict(
        page_size=256, heads=4, heads_kv=2, head_dim=128, seqlen_cache=3000, seqlen_q=65,
        seqlen_new=65, rotary_dim=0)),
    ("paged decode, page 1, d=64, window (100, 0)", dict(
        page_size=1, heads=2, heads_kv=2, seqlen_cache=700, causal=False, window=(100, 0),
        seqlen_q=2, seqlen_new=2)),
    ("paged decode, page 17, d=256, fp16, 3 splits", dict(
        page_size=17, heads=2, heads_kv=2, head_dim=256, seqlen_cache=1500, num_splits=3,
        dtype=torch.float16)),
    ("cache_batch_idx + cache_leftpad, d=128", dict(
        batch_idx=True, leftpad=True, heads=4, heads_kv=4, head_dim=128, seqlen_cache=2000)),
]


def check_paged_cases(tally):
    from test_kvcache import Case

    for i, (name, arguments) in enumerate(PAGED_CASES):
        case = Case(seed=i, device="cuda", **arguments)
        with tally.case(name):
            names = kernels_run(lambda: case.check())
            assert_ran(names, "fwd_sm90_kernel", "Hopper kernel")


# Packed GQA decodes (gqa_decode.h: a kv head's query heads as the rows of one CTA), paged, indexed
# and dense caches: test_kvcache.Case arguments. g = 4, 8, 5 (idle rows in each consumer's 64).
PACKED_CASES = [
    ("packed decode, page 16, g=4, d=128, 8k cache", dict(
        page_size=16, batch=4, heads=32, heads_kv=8, head_dim=128, seqlen_cache=8000)),
    ("packed decode, page 256, g=8, d=64, 4 tokens, 3 splits", dict(
        page_size=256, heads=8, heads_kv=1, seqlen_cache=3000, seqlen_q=4, seqlen_new=4,
        num_splits=3)),
    ("packed decode, dense cache, g=5, d=256, fp16, 7 tokens", dict(
        heads=10, heads_kv=2, head_dim=256, seqlen_cache=2000, seqlen_q=7, seqlen_new=7,
        dtype=torch.float16)),
    ("packed decode, cache_batch_idx, g=4, d=128, window (100, 0)", dict(
        batch_idx=True, heads=8, heads_kv=2, head_dim=128, seqlen_cache=1500, causal=False,
        window=(100, 0))),
]


def check_packed_cases(tally):
    from test_kvcache import Case

    for i, (name, arguments) in enumerate(PACKED_CASES):
        case = Case(seed=100 + i, device="cuda", **arguments)
        with tally.case(name):
            names = kernels_run(lambda: case.check())
            assert_ran(names, "fwd_sm90_kernel", "Hopper kernel")
            assert not any("fwd_kernel_16bit" in n for n in names), f"sm_80's kernel ran too: {names}"


# FP8 (e4m3) GQA decodes through flash_attn_func, which the FP8 plan packs as the 16-bit one
# (plan_fwd_fp8.h): (causal, B, Hq, Hkv, Sq, Sk); g = 4, 8, 3 (Q in two boxes a CTA). Checked as
# hopper_fp8_fwd.py checks the kernel: against float64 on the dequantized inputs within the bound
# e4m3 rounding of P allows (FP8 wgmma's accumulation is not IEEE f32), the LSE within 1e-3.
# (FP8 split-KV: FP8_KVCACHE_CASES below, through flash_attn_with_kvcache.)
FP8_PACKED_CASES = [
    (False, 2, 32, 8, 1, 8000),
    (True, 1, 8, 1, 7, 3000),
    (True, 2, 6, 2, 5, 777),
]


def check_fp8_packed_cases(tally):
    import flashattn
    from hopper_fp8_fwd import reference

    for causal, b, hq, hkv, sq, sk in FP8_PACKED_CASES:
        name = f"FP8 packed decode causal={causal} B={b} Hq={hq} Hkv={hkv} Sq={sq} Sk={sk}"
        q = torch.randn(b, sq, hq, 128, device="cuda").to(torch.float8_e4m3fn)
        k, v = (torch.randn(b, sk, hkv, 128, device="cuda").to(torch.float8_e4m3fn)
                for _ in range(2))
        descales = tuple(torch.rand(b, hkv, device="cuda") + 0.5 for _ in range(3))
        result = []
        with tally.case(name):
            names = kernels_run(lambda: result.append(flashattn.flash_attn_func(
                q, k, v, causal=causal, return_attn_probs=True, q_descale=descales[0],
                k_descale=descales[1], v_descale=descales[2])))
            assert_ran(names, "fwd_sm90_kernel", "Hopper FP8 kernel")
            out, lse, _ = result[0]
            _, want_exact, bound, want_lse = reference(q, k, v, causal, descales)
            excess = (out.double() - want_exact).abs() / (bound + 2 ** -8 * want_exact.abs() + 1e-3)
            assert excess.max().item() <= 1, f"out past e4m3's bound: {excess.max().item():.3g}"
            assert ((lse.double() - want_lse).abs() <= 1e-3).all(), "lse"


# The FP8 loops' features through torch.ops.flashattn.fwd: (window (left, right); causal is
# (-1, 0), bottom-right?, softcap, ALiBi?, attn_mask (None, "bool" key padding, "float" per head),
# B, Sq, Sk, Hq, Hkv): each e4m3 loop (no mask, causal, local) with softcap, ALiBi and attn_mask at
# run time. Checked against tests/fp8_reference.py on the CPU as the packed decodes above are:
# within e4m3's bound of the unrounded attention (FP8 wgmma's accumulation is not IEEE f32, so the
# shim's P-rounded comparison is not made here), the LSE within 1e-3.
FP8_FEATURE_CASES = [
    ((256, 64), True, 0.0, False, None, 2, 1000, 1500, 4, 2),
    ((-1, 0), True, 30.0, False, None, 1, 777, 777, 4, 4),
    ((100, 30), False, 0.0, True, None, 2, 513, 300, 2, 1),
    ((-1, -1), True, 0.0, False, "bool", 2, 600, 1500, 4, 2),
    ((-1, 0), True, 2.5, True, "float", 1, 300, 513, 2, 2),
]


def check_fp8_feature_cases(tally):
    from fp8_reference import reference

    for window, bottom_right, softcap, alibi, mask_kind, b, sq, sk, hq, hkv in FP8_FEATURE_CASES:
        name = (f"FP8 window={window} bottom_right={bottom_right} softcap={softcap} alibi={alibi} "
                f"attn_mask={mask_kind} B={b} Sq={sq} Sk={sk} Hq={hq} Hkv={hkv}")
        q = torch.randn(b, sq, hq, 128, device="cuda").to(torch.float8_e4m3fn)
        k, v = (torch.randn(b, sk, hkv, 128, device="cuda").to(torch.float8_e4m3fn)
                for _ in range(2))
        qd, kd, vd = (torch.rand(b, hkv, device="cuda") + 0.5 for _ in range(3))
        slopes = torch.rand(hq, device="cuda") * 0.1 + 0.005 if alibi else None
        mask = None
        if mask_kind == "bool":  # key padding: each sequence hides a third of its keys
            mask = (torch.rand(b, 1, 1, sk, device="cuda") >= 0.3)
        elif mask_kind == "float":
            mask = torch.randn(b, hq, sq, sk, device="cuda").masked_fill(
                torch.rand(b, hq, sq, sk, device="cuda") < 0.3, float("-inf"))
        result = []
        with tally.case(name):
            names = kernels_run(lambda: result.append(torch.ops.flashattn.fwd(
                q, k, v, window_left=window[0], window_right=window[1], softcap=softcap,
                alibi_slopes=slopes, attn_mask=mask, align_bottom_right=bottom_right,
                q_descale=qd, k_descale=kd, v_descale=vd)))
            assert_ran(names, "fwd_sm90_kernel<__nv_fp8_e4m3", "Hopper FP8 kernel")
            out, lse = (t.cpu() for t in result[0])
            for i in range(b):
                bias = None
                if mask is not None:
                    m = mask[i].expand(hq, sq, sk).cpu()
                    bias = (torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, float("-inf"))
                            if m.dtype == torch.bool else m.double())
                _, want_exact, bound, want_lse, _ = reference(
                    q[i].cpu(), k[i].cpu(), v[i].cpu(), window, bottom_right, 128 ** -0.5,
                    qd[i].cpu(), kd[i].cpu(), vd[i].cpu(), softcap,
                    slopes=None if slopes is None else slopes.cpu(), bias=bias)
                got = out[i].double()
                excess = (got - want_exact).abs() / (bound + 2 ** -8 * want_exact.abs() + 1e-3)
                assert not got.isnan().any(), f"sequence {i}: unwritten (poisoned) rows in out"
                assert excess.max().item() <= 1, \
                    f"sequence {i}: out past e4m3's bound: {excess.max().item():.3g}"
                finite = want_lse.isfinite()
                assert (lse[i][~finite] == float("-inf")).all(), f"sequence {i}: lse of empty rows"
                assert ((lse[i].double() - want_lse).abs()[finite] <= 1e-3).all(), f"sequence {i}: lse"


# FP8 (e4m3) decodes through flash_attn_with_kvcache: (causal, B, Hq, Hkv, Sq, cache rows,
# cache_seqlens, seqlen_new, num_splits, page size (0: a dense cache)); new e4m3 rows appended in
# place (kv_append_kernel), the FP8 plan's split-KV (0: its own count; n > 1 runs the split
# merge), packed GQA heads; a paged cache's pages in a shuffled block table (the e4m3 kernel's
# gathering producer). Checked per sequence over its cache_seqlens + seqlen_new keys as
# check_fp8_feature_cases checks, against tests/fp8_reference.py's unrounded attention (e4m3's
# bound holds for any split: a part's running max is at most the row's), the appended rows byte
# for byte.
FP8_KVCACHE_CASES = [
    (True, 3, 32, 8, 1, 4096, [4000, 0, 1000], 1, 0, 0),
    (False, 2, 8, 1, 1, 3000, [2999, 129], 0, 4, 0),
    (True, 1, 6, 2, 5, 2048, [1500], 5, 3, 0),
    (True, 2, 16, 2, 1, 4096, [3001, 77], 1, 0, 16),
]


def fp8_pages(cache, page_size, order):
    """A dense cache [B, rows, H, D] (rows a multiple of page_size) as pages [B rows / page_size,
    page_size, H, D], block j of the cache (in sequence-major order) in page order[j]."""
    pages = torch.empty_like(cache).view(-1, page_size, *cache.shape[2:])
    pages[order] = cache.reshape(-1, page_size, *cache.shape[2:])
    return pages


def check_fp8_kvcache_cases(tally):
    import flashattn
    from fp8_reference import reference

    fp8 = torch.float8_e4m3fn
    for causal, b, hq, hkv, sq, rows, seqlens, s_new, splits, page in FP8_KVCACHE_CASES:
        name = (f"FP8 kvcache decode causal={causal} B={b} Hq={hq} Hkv={hkv} Sq={sq} "
                f"seqlens={seqlens} new={s_new} num_splits={splits} page_size={page}")
        q = torch.randn(b, sq, hq, 128, device="cuda").to(fp8)
        k_cache, v_cache = (torch.randn(b, rows, hkv, 128, device="cuda").to(fp8)
                            for _ in range(2))
        layout = {}
        if page:  # the block table: a shuffle of the pages
            order = torch.randperm(b * rows // page, device="cuda")
            k_cache, v_cache = fp8_pages(k_cache, page, order), fp8_pages(v_cache, page, order)
            table = order.to(torch.int32).view(b, rows // page)
            layout["block_table"] = table

        def dense(cache, i):  # sequence i's rows, in order, from either layout
            return cache[table[i].long()].flatten(0, 1) if page else cache[i]
        k_new, v_new = ((torch.randn(b, s_new, hkv, 128, device="cuda").to(fp8)
                         for _ in range(2)) if s_new else (None, None))
        qd, kd, vd = (torch.rand(b, hkv, device="cuda") + 0.5 for _ in range(3))
        used = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
        result = []
        with tally.case(name):
            names = kernels_run(lambda: result.append(flashattn.flash_attn_with_kvcache(
                q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=used, causal=causal,
                num_splits=splits, return_softmax_lse=True, q_descale=qd, k_descale=kd,
                v_descale=vd, **layout)))
            assert_ran(names, "fwd_sm90_kernel<__nv_fp8_e4m3", "Hopper FP8 kernel")
            if splits > 1:
                assert_ran(names, "split_merge", "split merge")
            out, lse = (t.cpu() for t in result[0])
            assert out.dtype == torch.bfloat16
            for i, n in enumerate(seqlens):
                kc, vc = dense(k_cache, i).cpu(), dense(v_cache, i).cpu()
                if s_new:  # the appended rows, byte for byte
                    for cache, new, what in ((kc, k_new, "k"), (vc, v_new, "v")):
                        assert torch.equal(cache[n:n + s_new].view(torch.uint8),
                                           new[i].cpu().view(torch.uint8)), f"{what}[{i}] appended"
                length = n + s_new
                _, want_exact, bound, want_lse, _ = reference(
                    q[i].cpu(), kc[:length], vc[:length], (-1, 0) if causal else (-1, -1),
                    True, 128 ** -0.5, qd[i].cpu(), kd[i].cpu(), vd[i].cpu())
                got = out[i].double()
                assert not got.isnan().any(), f"sequence {i}: unwritten (poisoned) rows in out"
                excess = (got - want_exact).abs() / (bound + 2 ** -8 * want_exact.abs() + 1e-3)
                assert excess.max().item() <= 1, \
                    f"sequence {i}: out past e4m3's bound: {excess.max().item():.3g}"
                finite = want_lse.isfinite()
                assert (lse[i][~finite] == float("-inf")).all(), f"sequence {i}: lse of empty rows"
                assert ((lse[i].double() - want_lse).abs()[finite] <= 1e-3).all(), \
                    f"sequence {i}: lse"


def forward_tflops(causal, d=128, seqlen=4096, tokens=16384, hidden=2048, iters=20):
    b, h = tokens // seqlen, hidden // d
    q, k, v = (torch.randn(b, seqlen, h, d, dtype=torch.bfloat16, device="cuda")
               for _ in range(3))
    flop = 4 * b * h * seqlen * seqlen * d / (2 if causal else 1)
    return tflops(lambda: torch.ops.flashattn.fwd(q, k, v, causal=causal), flop, iters)


# Issue 31's targets: d = 128 >= 1.05x cuDNN, d = 256 >= 1.0x (cuDNN's 624 TFLOP/s, run 2).
BENCHMARKS = [(f"library forward, Hopper kernels, bf16 d={d} N=4096 B*N=16k causal={causal}",
               lambda d=d, causal=causal: forward_tflops(causal, d=d))
              for d in (128, 256) for causal in (False, True)]


if __name__ == "__main__":
    sys.exit(run_sample(check_cases, BENCHMARKS))
