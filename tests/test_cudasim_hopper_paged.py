"""The sm_90a forward's gathering producer (csrc/cuda/hopper/fwd_sm90_gather.cuh): K and V of a
paged KV cache, or of another batch entry after a left pad (cache_batch_idx, cache_leftpad),
loaded row by row with cp.async into the swizzled tiles TMA would leave.

- selftest/hopper_paged_test.cpp: the same keys in a dense cache (TMA) and in the gathered cache
  give the same bits of out and lse: page sizes 1, 16, 48 (dividing neither key tile) and 256,
  shuffled block tables, lengths 0, 1, ragged and full, causal, local and no mask, GQA, d = 64,
  128 and 256, under every warp schedule and copy completion; a sequence of six key tiles
  wraps the three-stage ring twice. Planted bugs in copies of the kernel's source (an ignored
  block table, an off-by-one page, a forgotten swizzle, a missing proxy fence, a thread that
  never arrives, a tile announced before its copies are done) must each fail it.
- The library path (torch.ops.flashattn_sim.fwd_kvcache on an opted-in compute capability 9.0
  device): flash_attn_with_kvcache's calls against the float64 reference within 2x PyTorch's own
  error (test_kvcache.py Case.check), outputs poisoned, with the Hopper kernel's gathered main
  loop the one that ran; split-KV too, the parts merged by sm_80's merge kernel.
"""
import os
import re
import shutil
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "cudasim"))
import build  # noqa: E402
from fixtures import assert_every_line_ok, planted_header, program, run  # noqa: E402
from hopper_sim import schedule_fixture  # noqa: E402
from test_kvcache import Case  # noqa: E402

SOURCE = os.path.join(build.SHIM_DIR, "selftest", "hopper_paged_test.cpp")

SCHEDULES = [("forward", "lazy"), ("forward", "eager"), ("reverse", "eager"),
             ("reverse", "lazy"), ("random:31", "random"), ("random:7", "eager")]
SELFTEST_CASES = ["bf16_d128_causal_page16", "bf16_d128_causal_page48", "bf16_d128_causal_indexed",
                  "f16_d64_none_page1", "f16_d64_none_page256", "f16_d64_none_indexed",
                  "bf16_d256_causal_page16", "bf16_d256_causal_page48", "f16_d128_local_page16",
                  "bf16_d64_local_indexed"]


@pytest.mark.parametrize("schedule, completion", SCHEDULES, ids=lambda s: s)
@pytest.mark.parametrize("case", SELFTEST_CASES)
def test_gathered_cache_gives_the_dense_cache_bits(case, schedule, completion):
    out = run(program("hopper_paged_test"), case, schedule=schedule, completion=completion,
              timeout=300)
    assert_every_line_ok(out)


# (what the bug is, file under csrc, the text, its replacement (or None and a list of (text,
# replacement) pairs in its place), what the run must print)
SAME_BITS_BROKEN = r"WRONG: .* \d+ O elements and \d+ LSE rows differ"
PLANTED = {
    "ignores_the_block_table": (
        "cuda/hopper/fwd_sm90_gather.cuh",
        "key_row<const Word>(view, cache, seq, head_kv, my_key)",
        "view.row<const Word>(seq.kv_batch, head_kv, my_key)", SAME_BITS_BROKEN),
    "off_by_one_page": (
        "kv_rows.h",
        "clamp_index(cache.block_table[s.batch * cache.block_table_stride + entry], cache.num_pages)",
        "clamp_index(cache.block_table[s.batch * cache.block_table_stride + entry] + 1, "
        "cache.num_pages)", SAME_BITS_BROKEN),
    "forgets_the_swizzle": (
        "cuda/hopper/fwd_sm90_gather.cuh",
        "16 * ((piece % 8) ^ (row_in_tile % 8))", "16 * (piece % 8)", SAME_BITS_BROKEN),
    # Both fences: without the K one alone, the shim runs the producer thread on to its V fence
    # before any consumer reads K (a warp runs until it blocks), so nothing can see the gap.
    "no_proxy_fences": (
        "cuda/hopper/fwd_sm90_gather.cuh",
        [("ptx::fence_proxy_async_shared_cta();  // SITE:gather_k_fence", "// no fence"),
         ("ptx::fence_proxy_async_shared_cta();\n  ptx::mbarrier_arrive(v_full);  // SITE:gather_v_arrive",
          "ptx::mbarrier_arrive(v_full);")],
        None, r"SimError: .*through the async proxy.*has not executed fence\.proxy\.async"),
    "a_thread_never_arrives": (
        "cuda/hopper/fwd_sm90_gather.cuh",
        "ptx::mbarrier_arrive(v_full);  // SITE:gather_v_arrive",
        "if (threadIdx.x != 127) ptx::mbarrier_arrive(v_full);", r"SimError: cudasim: deadlock"),
    # The producer announces the older tile in flight as if the newest tile's two groups were
    # older still: its waits return before the older tile's own copies are done. (Seen only past
    # three tiles: before that, the producer runs to its last wait before any consumer reads.)
    "announces_a_tile_before_its_copies": (
        "cuda/hopper/fwd_sm90_kernel.cuh",
        "announce_gathered_tile<2 * kLag>(&k_full[older], &v_full[older]);",
        "announce_gathered_tile<2 * kLag + 2>(&k_full[older], &v_full[older]);", SAME_BITS_BROKEN),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, tmp_path):
    """The self-test built against a copy of one kernel header with the bug planted (found first
    through -iquote), holding the bf16 d = 128 causal cases only: it must fail, saying why."""
    path, text, planted, expected = PLANTED[bug]
    edits = text if planted is None else [(text, planted)]
    flags = planted_header(tmp_path, path, edits)
    if shutil.which(build.CXX) is None or build.cuda_include_dir() is None:
        pytest.skip("no compiler or CUDA headers for the shim")
    exe = build.build_program([SOURCE], f"hopper_paged_test_{bug}", build.DEFAULT_BUILD_DIR,
                              extra_flags=flags + ["-DHOPPER_PAGED_ONE_CONFIG"])
    failures = []
    for case in ("bf16_d128_causal_page16", "bf16_d128_causal_page48"):
        out = run(exe, case, timeout=300)
        failures.append(out.returncode != 0 and re.search(expected, out.stdout) is not None)
        assert out.returncode in (0, 1, 3), out.stdout + out.stderr
    assert any(failures), f"planted bug {bug} went unnoticed"


# ---- the library path ----

schedule = schedule_fixture(SCHEDULES[:3] + SCHEDULES[4:5])


def gathered_kernel(dtype, d, mask):
    """The gathered main loop's name: fwd_sm90_kernel<Elem, d, kCausal, kSoftcap, kLocal, kAlibi,
    kAttnMask, kGatherKv, kDropout>."""
    element = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}[dtype]
    causal, local = mask == "causal", mask == "local"
    return (f"fwd_sm90_kernel<{element}, {d}, {str(causal).lower()}, false, "
            f"{str(local).lower()}, false, false, true, false>")


# (name, Case arguments, mask): page sizes 1, 16, 17 and 256; a cache longer than a page with
# ragged cache_seqlens (not multiples of the page size), appends of 1 and 3 new tokens with and
# without rotary; cache_batch_idx and cache_leftpad; GQA with enough query rows not to be packed
# (packed GQA decodes: test_cudasim_hopper_packed_gqa.py); no mask, causal, a local window; d = 64, 128, 256;
# split-KV with 3 parts and the plan's own count.
LIBRARY_CASES = [
    ("page1_mha", dict(page_size=1, seqlen_cache=40, heads=2, heads_kv=2), "causal"),
    ("page16_split3", dict(page_size=16, heads=2, heads_kv=2, num_splits=3, seqlen_cache=500,
                           head_dim=128), "causal"),
    ("page17_not_causal", dict(page_size=17, seqlen_q=3, seqlen_new=3, heads=2, heads_kv=2,
                               causal=False, rotary_dim=0), "none"),
    ("page256_gqa_chunk", dict(page_size=256, seqlen_cache=600, seqlen_q=65, seqlen_new=65,
                               heads=4, heads_kv=2, rotary_dim=0, num_splits=1), "causal"),
    ("page16_local", dict(page_size=16, window=(20, 0), causal=False, seqlen_q=2, heads=2,
                          heads_kv=2), "local"),
    ("page16_d256_split_auto", dict(page_size=16, head_dim=256, heads=1, heads_kv=1,
                                    seqlen_cache=700, dtype=torch.float16), "causal"),
    ("cache_batch_idx", dict(batch_idx=True, heads=2, heads_kv=2, head_dim=128), "causal"),
    ("leftpad", dict(leftpad=True, seqlen_q=2, seqlen_new=2, heads=2, heads_kv=2), "causal"),
    ("leftpad_batch_idx_split", dict(leftpad=True, batch_idx=True, heads=2, heads_kv=2,
                                     num_splits=2, seqlen_cache=400), "causal"),
]


@pytest.mark.parametrize("name, arguments, mask", LIBRARY_CASES, ids=[c[0] for c in LIBRARY_CASES])
def test_kvcache_through_the_library(schedule, hopper, name, arguments, mask):
    case = Case(seed=len(name), **arguments)
    _, counters = hopper.counted(lambda: case.check(hopper.ops))
    kernels = [launch["kernel"] for launch in counters["launches"]]
    forward = [k for k in kernels if "fwd_sm90_kernel" in k or "fwd_kernel_16bit" in k]
    assert len(forward) == 1, kernels
    assert gathered_kernel(case.q.dtype, case.q.shape[-1], mask) in forward[0], kernels
    splits = arguments.get("num_splits", 0)
    if splits > 1:
        assert any("split_merge" in k for k in kernels), kernels


def test_gathered_split_parts_cover_the_tiles_once(hopper):
    """Split-KV on a paged cache: the parts run as many wgmma between them as one unsplit launch
    (parts that each ran every tile would merge to the same result)."""
    case = Case(page_size=16, heads=2, heads_kv=2, seqlen_cache=900, head_dim=64, seqlen_new=0,
                rotary_dim=0, num_splits=3, seed=5)

    def wgmma(counters):
        return sum(launch["counters"]["wgmma"]["instructions"] for launch in counters["launches"])

    (split_out, _), split = hopper.counted(lambda: case.call(hopper.ops))
    (one_out, _), one = hopper.counted(lambda: case.call(hopper.ops, num_splits=1))
    assert any("split_merge" in launch["kernel"] for launch in split["launches"])
    assert wgmma(split) == wgmma(one) > 0
    torch.testing.assert_close(split_out.float(), one_out.float(), atol=2e-2, rtol=0)


def test_what_the_gathered_loops_lack_runs_on_sm80(hopper):
    """Softcap and ALiBi with a paged cache are not among the gathered main loops: the same call
    runs the sm_80 kernels, and is right."""
    for arguments in (dict(softcap=5.0), dict(alibi=True)):
        case = Case(page_size=16, heads=2, heads_kv=2, **arguments)
        _, counters = hopper.counted(lambda: case.check(hopper.ops))
        kernels = [launch["kernel"] for launch in counters["launches"]]
        assert any("fwd_kernel_16bit" in k for k in kernels), kernels
        assert not any("fwd_sm90_kernel" in k for k in kernels), kernels


@pytest.mark.parametrize("page_size", [16, 17])
def test_varlen_queries_on_a_paged_cache(hopper, page_size):
    """flash_attn_varlen_func with a block table: cu_seqlens_k gives only the lengths (the keys
    are pages), sequence b's rows are its queries (cache_sequence, as sequence.h's)."""
    from checks import to64
    from flashattn._reference import attention_reference
    from tolerance import assert_within_torch_error

    torch.manual_seed(page_size)
    lengths_q, lengths_k = [3, 1, 70], [40, 7, 200]
    heads, dim, dtype = 2, 64, torch.bfloat16
    blocks = -(-max(lengths_k) // page_size)
    pages = 3 * blocks + 2
    k_pages, v_pages = (torch.randn(pages, page_size, heads, dim, dtype=dtype) for _ in range(2))
    table = torch.randperm(pages, dtype=torch.int32)[:3 * blocks].view(3, -1)
    q = torch.randn(sum(lengths_q), heads, dim, dtype=dtype)
    cu_q = torch.tensor([0, 3, 4, 74], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 47, 247], dtype=torch.int32)
    (out, lse), counters = hopper.counted(lambda: hopper.ops.fwd(
        q, k_pages, v_pages, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=70,
        max_seqlen_k=200, block_table=table))
    kernels = [launch["kernel"] for launch in counters["launches"]]
    assert len(kernels) == 1 and gathered_kernel(dtype, dim, "causal") in kernels[0], kernels
    for b in range(3):
        keys = k_pages[table[b].long()].flatten(0, 1)[:lengths_k[b]][None]
        values = v_pages[table[b].long()].flatten(0, 1)[:lengths_k[b]][None]
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ref_out, ref_lse = attention_reference(to64(q[rows][None]), to64(keys), to64(values),
                                               causal=True)
        low_out, low_lse = attention_reference(q[rows][None], keys, values, causal=True)
        assert_within_torch_error(f"out {b}", out[rows][None], ref_out, low_out)
        assert_within_torch_error(f"lse {b}", lse[:, rows][None], ref_lse, low_lse.float())
