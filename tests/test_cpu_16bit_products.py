"""The CPU kernels' 16-bit operand path (csrc/cpu/panels16.h): bf16/fp16 tiles multiplied in 16
bits with fp32 accumulation. It is the default only on CPUs where it is faster than fp32
products (AMX; bf16 where vdpbf16ps clearly outruns them); FLASHATTN_CPU_16BIT_PRODUCTS=1
forces it on any CPU. Every test of the path runs once per 16-bit kernel this CPU has
(FLASHATTN_CPU_16BIT_KERNEL, tile_gemm.h): oneDNN's row-major brgemm everywhere, the AVX-512
kernels on VNNI-2 panels where the CPU has AVX-512 (test_cpu_gemm_16bit.py checks that against
/proc/cpuinfo), AMX on ATen-packed panels where it has AMX; and checks that the kernel ran.
"""
import pytest
import flashattn
import torch

from checks import (MASKS, assert_bitwise_deterministic, check_backward, check_forward,
                    make_qkv, make_qkv_far_below_zero, mask_arguments)
from cpu_test_ext.build import ops as cpu_test_ops
from executors import make_executor

FORCE = "FLASHATTN_CPU_16BIT_PRODUCTS"
KERNEL = "FLASHATTN_CPU_16BIT_KERNEL"
DTYPES_16 = [torch.bfloat16, torch.float16]
TEST_OPS = cpu_test_ops()
BENCH_OPS = torch.ops.flashattn_internal  # the shipped ops the bench reads
ALL_KERNELS = ["rowmajor", "amx", "avx512-dot", "avx512-fma"]


def runs_kernel(kernel, dtype):
    """Whether this CPU runs the 16-bit kernel for dtype: AMX per dtype (AMX-BF16 CPUs without
    AMX-FP16 run it for bf16 only); fp16 forced to avx512-dot takes avx512-fma."""
    amx, avx512, avx512_bf16, *_ = TEST_OPS.cpu_16bit_features(dtype)
    dot = avx512_bf16 if dtype == torch.bfloat16 else avx512
    return {"rowmajor": True, "amx": amx, "avx512-dot": dot, "avx512-fma": avx512}[kernel]


def kernels_here():
    """The 16-bit kernels this CPU runs for bf16 (a superset of fp16's)."""
    return [kernel for kernel in ALL_KERNELS if runs_kernel(kernel, torch.bfloat16)]


def cannot_run_here(item):
    """tests/conftest.py deselects the tests of a forced kernel this CPU lacks for the test's
    dtype (test_forcing_a_kernel_this_cpu_lacks_is_an_error checks that it is an error)."""
    params = getattr(item, "callspec", None)
    params = params.params if params else {}
    kernel = params.get("cpu16", params.get("kernel"))
    dtype = params.get("dtype", torch.bfloat16)
    if isinstance(kernel, str) and not runs_kernel(kernel, dtype):
        return f"this CPU lacks {kernel} for {dtype}"
    return None


def products_run():
    return {kernel: TEST_OPS.cpu_16bit_products_run(kernel) for kernel in ALL_KERNELS}


# The most query rows of a tile that takes the row products (row_products.h) on either operand
# path rather than tile products.
ROW_PRODUCT_ROWS = 16


@pytest.fixture(params=kernels_here())
def cpu16(monkeypatch, request):
    """The 16-bit path with one kernel forced; afterwards, checks that the tile products ran on
    that kernel (for bf16 or fp16, whichever the test used) and on no other. A forward-only test
    whose query tiles are all small enough for the row products runs none."""
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.setenv(KERNEL, request.param)
    expected = {BENCH_OPS.cpu_16bit_path(dtype)[0] for dtype in DTYPES_16
                if runs_kernel(request.param, dtype)}
    assert request.param in expected
    before = products_run()
    yield make_executor("cpu")
    ran = {kernel for kernel, count in products_run().items() if count > before[kernel]}
    assert ran <= expected, f"forced {request.param}, products ran on {ran}"
    params = request.node.callspec.params
    row_products_only = (request.node.originalname == "test_forward_16bit_products"
                         and params["seqlens"][0] <= ROW_PRODUCT_ROWS)
    assert bool(ran) != row_products_only, f"forced {request.param}, products ran on {ran}"


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
@pytest.mark.parametrize("seqlens", [(1, 1), (7, 7), (1, 129), (129, 1), (63, 65), (65, 63),
                                     (127, 257), (257, 127)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("mask", ["none", "causal", "causal_top_left", "window", "softcap_causal",
                                  "alibi_batch_causal", "all"])
def test_forward_16bit_products(cpu16, dtype, seqlens, mask):
    check_forward(cpu16, *make_qkv(2, *seqlens, 2, 2, 64, dtype, cpu16.device), MASKS[mask])


# Odd dims pad the score product's K to even; dims past 64 span several value panels.
@pytest.mark.parametrize("head_dim", [1, 7, 32, 63, 65, 128, 130, 256])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_head_dims_16bit_products(cpu16, head_dim, dtype):
    check_forward(cpu16, *make_qkv(1, 65, 200, 2, 1, head_dim, dtype, cpu16.device),
                  MASKS["causal"])


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
@pytest.mark.parametrize("seqlens", [(1, 1), (7, 65), (65, 7), (63, 129), (129, 63), (257, 257)],
                         ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("mask", ["none", "causal", "window_causal", "softcap_causal",
                                  "alibi_batch_causal", "causal_top_left", "all"])
def test_backward_16bit_products(cpu16, dtype, seqlens, mask):
    check_backward(cpu16, *make_qkv(2, *seqlens, 2, 2, 32, dtype, cpu16.device), MASKS[mask])


@pytest.mark.parametrize("head_dim", [1, 7, 63, 65, 130, 256])
@pytest.mark.parametrize("heads,heads_kv", [(2, 2), (6, 2)])
def test_backward_head_dims_and_gqa_16bit_products(cpu16, head_dim, heads, heads_kv):
    q, k, v = make_qkv(1, 70, 150, heads, heads_kv, head_dim, torch.bfloat16, cpu16.device)
    check_backward(cpu16, q, k, v, MASKS["causal"], with_dlse=True)


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_logits_far_below_zero_16bit_products(cpu16, dtype):
    """Rows whose every logit is far below zero (checks.make_qkv_far_below_zero)."""
    q, k, v = make_qkv_far_below_zero(2, 97, 300, 2, 1, 64, dtype, cpu16.device)
    check_forward(cpu16, q, k, v, MASKS["causal"])
    check_backward(cpu16, q, k, v, MASKS["causal"])


def test_backward_16bit_products_deterministic(cpu16):
    assert_bitwise_deterministic(cpu16, torch.bfloat16, "all")


def test_strided_inputs_16bit_products(cpu16):
    q, k, v = torch.randn(2, 77, 3, 3, 40, dtype=torch.bfloat16).unbind(2)
    check_forward(cpu16, q, k, v, MASKS["causal"])
    check_backward(cpu16, q, k, v, MASKS["causal"])


def test_same_result_as_fp32_products_up_to_rounding_of_p(monkeypatch):
    """The 16-bit path differs from the fp32 one only by rounding P to 16 bits before P·V."""
    monkeypatch.delenv(KERNEL, raising=False)
    ex = make_executor("cpu")
    q, k, v = make_qkv(1, 100, 300, 2, 2, 64, torch.bfloat16, ex.device)
    monkeypatch.setenv(FORCE, "0")
    out32, lse32 = ex.fwd(q, k, v, 0.125, causal=True)
    monkeypatch.setenv(FORCE, "1")
    out16, lse16 = ex.fwd(q, k, v, 0.125, causal=True)
    assert not torch.equal(out16, out32), "the override did not switch the operand path"
    torch.testing.assert_close(lse16, lse32, rtol=0, atol=1e-5)
    torch.testing.assert_close(out16.float(), out32.float(), rtol=0, atol=2e-2)


def runs_x86_64_v4():
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= set(flags)


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
@pytest.mark.parametrize("seqlens", [(65, 63), (127, 257), (257, 127)],
                         ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("mask", ["none", "causal", "softcap_causal", "all"])
def test_forward_16bit_products_both_softmax_widths(monkeypatch, dtype, seqlens, mask):
    """The 16-bit products' online softmax (scale, exp, sums, rounding of P in one pass,
    softmax_vec.h) at 8 and 16 lanes (FLASHATTN_CPU_ROW_LANES): both against the reference, and
    the same up to the order of the row sums. Without row steps the scale is applied in that
    pass; with them (softcap, masks) first; either way S * scale is rounded before the exponent."""
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.delenv(KERNEL, raising=False)
    ex = make_executor("cpu")
    q, k, v = make_qkv(2, *seqlens, 2, 2, 64, dtype, ex.device)
    if not runs_x86_64_v4():
        monkeypatch.setenv("FLASHATTN_CPU_ROW_LANES", "16")
        with pytest.raises(RuntimeError, match="FLASHATTN_CPU_ROW_LANES=16 needs AVX-512"):
            ex.fwd(q, k, v, 0.125, causal=True)
        pytest.skip("checked that this CPU, without AVX-512, refuses 16 lanes")
    outs = {}
    for lanes in ("8", "16"):
        monkeypatch.setenv("FLASHATTN_CPU_ROW_LANES", lanes)
        check_forward(ex, q, k, v, MASKS[mask])
        outs[lanes] = ex.fwd(q, k, v, 0.125, causal=True)
    for a, b in zip(outs["8"], outs["16"]):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-5)


# (Sq, Sk, first row, rows) of a block of rows, GQA group 2: the block takes the decode kernel
# where the whole call takes tiles (2 and 10 rows per kv head against 130), the keys in lanes
# where the whole call takes the rows in lanes (2 and 8 rows against 14), both the rows (10
# against 40 rows: decode against tiles).
VDPBF16PS_ROW_BLOCKS = [(65, 47, 40, 1), (65, 65, 60, 5), (7, 7, 6, 1), (7, 7, 2, 4), (20, 20, 3, 5)]


@pytest.mark.parametrize("kernel", ["avx512-dot"])
@pytest.mark.parametrize("sizes", VDPBF16PS_ROW_BLOCKS,
                         ids=lambda s: "Sq{}-Sk{}-rows{}+{}".format(*s))
@pytest.mark.parametrize("mask", ["none", "causal", "all"])
def test_vdpbf16ps_row_block_is_the_whole_calls_rows_bit_for_bit(monkeypatch, kernel, sizes,
                                                                  mask):
    """On vdpbf16ps every score product adds a (row, key)'s pairs in order from zero (the tile
    GEMM, and the decode kernel's dots with the rows or the keys in the lanes), and the softmax
    rounds S * scale before the exponent with or without row steps: so a block of a sequence's
    rows (block_offsets: a ring rank's) gets the whole call's out and LSE bit for bit, whichever
    kernel each takes. On the other kernels a decode tile takes the fp32 row products (Q scaled
    in fp32), so there only test_block_offsets.py's sizes, which take one kernel, hold."""
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.setenv(KERNEL, kernel)
    ex = make_executor("cpu")
    seqlen_q, seqlen_k, first, rows = sizes
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 2, 41, torch.bfloat16, ex.device)
    scale, op_kwargs, _ = mask_arguments(MASKS[mask], q)
    out, lse = ex.fwd(q, k, v, scale, **op_kwargs)
    cut = slice(first, first + rows)
    offsets = torch.tensor([[first, 0, 0, seqlen_k - seqlen_q, b] for b in range(2)],
                           dtype=torch.int32)
    op_kwargs.pop("align_bottom_right", None)  # the whole call's alignment is in the offsets
    row_products = TEST_OPS.cpu_bf16_row_products_run()
    block_out, block_lse = ex.fwd(q[:, cut], k, v, scale, block_offsets=offsets, **op_kwargs)
    assert TEST_OPS.cpu_bf16_row_products_run() > row_products, "the block took no row products"
    assert torch.equal(block_out, out[:, cut])
    assert torch.equal(block_lse, lse[:, :, cut])


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_forcing_the_path_runs_this_cpus_kernel(monkeypatch, dtype):
    """FLASHATTN_CPU_16BIT_PRODUCTS=1 alone takes the kernel the choice gives this CPU (on an
    AVX-512 machine an AVX-512 kernel, never the row-major fallback) for forward and backward."""
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.delenv(KERNEL, raising=False)
    features = TEST_OPS.cpu_16bit_features(dtype)
    amx, avx512 = features[:2]
    kernel, _ = TEST_OPS.cpu_16bit_choice(*features, dtype)
    assert BENCH_OPS.cpu_16bit_path(dtype) == (kernel, True)
    assert kernel != "rowmajor" if (amx or avx512) else kernel == "rowmajor"
    q, k, v = make_qkv(1, 65, 130, 2, 1, 64, dtype, torch.device("cpu"))
    before = products_run()
    ex = make_executor("cpu")
    check_forward(ex, q, k, v, MASKS["causal"])
    check_backward(ex, q, k, v, MASKS["causal"])
    after = products_run()
    assert after[kernel] > before[kernel]
    assert all(after[other] == before[other] for other in ALL_KERNELS if other != kernel)


@pytest.mark.parametrize("kernel", ALL_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_forcing_a_kernel_this_cpu_lacks_is_an_error(monkeypatch, kernel, dtype):
    """Forcing a 16-bit kernel takes it where the CPU has it for the dtype, and is an error
    naming the variable and the kernel where it has not (AMX-BF16 CPUs without AMX-FP16: amx
    for fp16), never an illegal instruction or a silent fallback."""
    monkeypatch.setenv(FORCE, "1")
    monkeypatch.setenv(KERNEL, kernel)
    q, k, v = make_qkv(1, 65, 65, 1, 1, 64, dtype, torch.device("cpu"))
    if runs_kernel(kernel, dtype):
        check_forward(make_executor("cpu"), q, k, v, MASKS["causal"])
        return
    with pytest.raises(RuntimeError, match=f"{KERNEL}={kernel} needs .*which this CPU lacks"):
        torch.ops.flashattn.fwd(q, k, v, 0.125, True, -1, -1, 0.0, None, False, False)


def test_bad_override_is_named(monkeypatch):
    monkeypatch.setenv(FORCE, "yes")
    q, k, v = make_qkv(1, 8, 8, 1, 1, 16, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(RuntimeError, match=f"{FORCE} must be 0 or 1.*'yes'"):
        torch.ops.flashattn.fwd(q, k, v, 0.25, False, -1, -1, 0.0, None, True, False)


@pytest.mark.parametrize("kernel", kernels_here())
@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_decode_tiles_take_the_row_products_on_either_path(monkeypatch, kernel, dtype):
    """A tile of at most 16 query rows per kv head (a decode step: 1 or 4 tokens of a GQA group
    of 4) reads the cache rows where they are on the 16-bit path too, and runs no 16-bit tile
    product (packing panels for a few rows made a bf16 decode step 4x slower on a Zen 4, where
    the 16-bit path is the default). Where the tile products run on vdpbf16ps (bf16), so do the
    row products (row_products_dot.cpp: test_kvcache.py checks their accuracy); else they are
    the fp32 ones, with the fp32 path's bits. A longer query on the same cache does run the
    forced kernel, so the override took effect."""
    torch.manual_seed(0)
    k_cache, v_cache = (torch.randn(2, 300, 2, 64, dtype=dtype) for _ in range(2))
    seqlens = torch.tensor([300, 177], dtype=torch.int32)
    on_vdpbf16ps = kernel == "avx512-dot" and dtype == torch.bfloat16

    def call(seqlen_q):
        q = torch.randn(2, seqlen_q, 8, 64, dtype=dtype, generator=torch.Generator().manual_seed(1))
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                 causal=True, return_softmax_lse=True)

    for seqlen_q in (1, 4):
        monkeypatch.setenv(FORCE, "0")
        want = call(seqlen_q)
        monkeypatch.setenv(FORCE, "1")
        monkeypatch.setenv(KERNEL, kernel)
        before, rows_before = products_run(), TEST_OPS.cpu_bf16_row_products_run()
        got = call(seqlen_q)
        assert products_run() == before, "a decode tile ran the 16-bit tile products"
        assert (TEST_OPS.cpu_bf16_row_products_run() > rows_before) == on_vdpbf16ps
        for g, w in zip(got, want):
            if on_vdpbf16ps:  # P rounded to bf16, then bf16 output
                torch.testing.assert_close(g.float(), w.float(), rtol=0, atol=2e-2)
            else:
                assert torch.equal(g, w)
    before = products_run()
    call(40)
    assert products_run() != before
