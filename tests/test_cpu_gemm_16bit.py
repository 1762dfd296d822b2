"""The CPU's 16-bit tile products one by one (csrc/cpu/gemm_avx512_16bit.h, tile_gemm.h): each
kernel this CPU can run against plain loops at awkward sizes, the VNNI-2 packing order, the
kernel choice for CPUs with other features, and that a kernel this CPU lacks is refused, never
run. Through the test-only torch.ops.flashattn_test (tests/cpu_test_ext), which calls each
kernel by name.

No test here depends on the machine having a feature: where a kernel cannot run, the test checks
that /proc/cpuinfo indeed lacks what it needs and that asking for it is an error.
"""
import pytest
import torch

import flashattn
from cpu_test_ext.build import ops as cpu_test_ops

TEST_OPS = cpu_test_ops()
# The shipped ops `python -m flashattn.bench` reads: the path a call takes, the ceiling.
BENCH_OPS = torch.ops.flashattn_internal
DTYPES_16 = [torch.bfloat16, torch.float16]
KERNELS = ["rowmajor", "amx", "avx512-dot", "avx512-fma"]
# Awkward sizes: 1, below and above a 16-lane vector, a 6-row block, a 64-column panel.
SIZES_M = [1, 7, 31, 33, 64, 65, 128]
SIZES_N = [1, 7, 31, 33, 64, 65, 128]
SIZES_K = [1, 2, 7, 31, 33, 64, 65, 128, 129, 300]  # odd K too; 300 > one 128-deep fp32 panel


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


FEATURES = ["amx", "avx512", "avx512_bf16", "avx512_fp16", "dot_outruns_fma", "dot_outruns_fp32"]


def features(dtype):
    return dict(zip(FEATURES, TEST_OPS.cpu_16bit_features(dtype)))


def runs_here(kernel, dtype):
    f = features(dtype)
    return {"rowmajor": True, "amx": f["amx"], "avx512-dot": f["avx512_bf16"],
            "avx512-fma": f["avx512"]}[kernel]


def pack_for(kernel, b, ldb):
    """B [K, N] in the form `kernel` takes: row-major [K, ldb] or VNNI-2 [ceil(K/2), 2 ldb]."""
    if kernel == "rowmajor":
        out = torch.zeros(b.shape[0], ldb, dtype=b.dtype)
        out[:, :b.shape[1]] = b
        return out
    return TEST_OPS.cpu_pack_vnni2(b, ldb)


def plain_loops_fp32(a, b, c0):
    """C0 + A·B with every sum an fp32 sum, in the kernels' order: per k pair, row 2p+1's product
    first, then row 2p's. Products of two bf16/fp16 values are exact in fp32, so each step is
    the FMA the kernels make, and a kernel that follows this order matches it bit for bit."""
    a32, b32, acc = a.float(), b.float(), c0.clone()
    K = a.shape[1]
    for p in range(0, K - 1, 2):
        acc = acc + a32[:, p + 1, None] * b32[None, p + 1, :]
        acc = acc + a32[:, p, None] * b32[None, p, :]
    if K % 2:
        acc = acc + a32[:, K - 1, None] * b32[None, K - 1, :]
    return acc


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
@pytest.mark.parametrize("ldb_extra", [0, 3])
def test_vnni2_packing_order(dtype, ldb_extra):
    """Pair-row p holds rows 2p, 2p+1 interleaved: element (p, n, j) = B[2p + j][n]; an odd K
    gets a zero row; columns past N (up to ldb) are left alone."""
    for K in [1, 2, 7, 31, 64, 65, 128]:
        for N in [1, 7, 33, 64, 65]:
            b = torch.randn(K, N).to(dtype)
            packed = TEST_OPS.cpu_pack_vnni2(b, N + ldb_extra)
            assert packed.shape == ((K + 1) // 2, 2 * (N + ldb_extra))
            padded = torch.cat([b, torch.zeros(K % 2, N, dtype=dtype)])
            expected = padded.view(-1, 2, N).transpose(1, 2)  # [K/2, N, 2]
            pairs = packed.view((K + 1) // 2, N + ldb_extra, 2)
            assert torch.equal(pairs[:, :N].view(torch.int16), expected.view(torch.int16)), (K, N)
            assert (pairs[:, N:] == -1).all(), "wrote past the panel's columns"


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_against_plain_loops(kernel, dtype, accumulate):
    """Every size combination, with leading dimensions past the rows. Where the CPU lacks the
    kernel (or it has no form for dtype), asking for it must be an error."""
    if not runs_here(kernel, dtype):
        with pytest.raises(RuntimeError, match=f"the {kernel} kernel needs"):
            TEST_OPS.cpu_gemm16(torch.zeros(2, 2, dtype=dtype), pack_for("rowmajor",
                                torch.zeros(2, 2, dtype=dtype), 2), torch.zeros(2, 2),
                                kernel, accumulate)
        return
    exact = kernel == "avx512-fma" or (kernel == "avx512-dot" and "GenuineIntel" in cpu_vendor())
    for M in SIZES_M:
        for N in SIZES_N:
            for K in SIZES_K:
                if kernel == "amx" and K % 2:
                    # The library pads K to whole row pairs for AMX (panels16.h); oneDNN's AMX
                    # brgemm hit an illegal instruction on an odd K, so the op refuses it.
                    with pytest.raises(RuntimeError, match=f"amx kernel takes an even K.*K = {K}"):
                        TEST_OPS.cpu_gemm16(torch.zeros(M, K, dtype=dtype),
                                            pack_for(kernel, torch.zeros(K, N, dtype=dtype), N),
                                            torch.zeros(M, N), kernel, accumulate)
                    continue
                a_big = torch.randn(M, K + 5).to(dtype)
                a = a_big[:, :K]  # lda = K + 5
                b = torch.randn(K, N).to(dtype)
                c_big = torch.randn(M, N + 3) if accumulate else torch.full((M, N + 3), float("nan"))
                c0 = c_big[:, :N].clone() if accumulate else torch.zeros(M, N)
                beyond = c_big[:, N:].clone()
                TEST_OPS.cpu_gemm16(a, pack_for(kernel, b, N + 2), c_big[:, :N], kernel,
                                    accumulate)
                got = c_big[:, :N]
                where = f"{kernel} {dtype} M={M} N={N} K={K} accumulate={accumulate}"
                assert torch.equal(c_big[:, N:].nan_to_num(7.0), beyond.nan_to_num(7.0)), \
                    f"{where}: wrote past column N"
                if exact:
                    torch.testing.assert_close(got, plain_loops_fp32(a, b, c0), rtol=0, atol=0,
                                               msg=lambda m: f"{where}: {m}")
                # Any order of fp32 sums: within K roundings of the float64 product.
                want = c0.double() + a.double() @ b.double()
                bound = (c0.double().abs() + a.double().abs() @ b.double().abs()) * (K + 1) * 2**-23
                assert ((got.double() - want).abs() <= bound + 1e-30).all(), where


def cpu_vendor():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    return ""


def test_kernels_exact_on_integers():
    """Small integers multiply exactly in every kernel, whatever its order of sums: each one this
    CPU runs gives exactly the integer product (the check panels16.h makes once at run time)."""
    ran = 0
    for dtype in DTYPES_16:
        for kernel in KERNELS:
            if not runs_here(kernel, dtype):
                continue
            a = torch.randint(-3, 4, (37, 70)).to(dtype)
            b = torch.randint(-3, 4, (70, 100)).to(dtype)
            c = torch.randint(-5, 6, (37, 100)).float()
            want = c + a.float() @ b.float()
            TEST_OPS.cpu_gemm16(a, pack_for(kernel, b, 100), c, kernel, True)
            assert torch.equal(c, want), (kernel, dtype)
            ran += 1
    assert ran >= 2  # rowmajor runs everywhere, for both dtypes


def test_features_match_cpuinfo():
    """What the kernel choice believes this CPU has is what /proc/cpuinfo says it has."""
    flags = cpu_flags()
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    bf16, fp16 = features(torch.bfloat16), features(torch.float16)
    assert bf16["avx512"] == fp16["avx512"] == avx512
    assert bf16["avx512_bf16"] == (avx512 and "avx512_bf16" in flags)
    assert fp16["avx512_bf16"] is False  # vdpbf16ps has no fp16 form
    assert bf16["avx512_fp16"] == fp16["avx512_fp16"] == (avx512 and "avx512_fp16" in flags)
    if bf16["amx"]:
        assert "amx_bf16" in flags
    if fp16["amx"]:
        assert "amx_fp16" in flags
    # Timed only where both AVX-512 kernels run and AMX does not.
    if bf16["dot_outruns_fma"] or bf16["dot_outruns_fp32"]:
        assert bf16["avx512_bf16"] and bf16["avx512"] and not bf16["amx"]
    assert not fp16["dot_outruns_fma"] and not fp16["dot_outruns_fp32"]


@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_choice_for_other_cpus(dtype):
    """The default kernel and whether bf16/fp16 attention takes 16-bit products at all, for CPUs
    this machine is not."""
    bf16 = dtype == torch.bfloat16

    def choice(**features):
        return TEST_OPS.cpu_16bit_choice(*(features.get(name, False) for name in FEATURES), dtype)

    # Without AVX-512 (AVX2 CPUs such as Zen 3): fp32 products; forced, oneDNN's row-major brgemm.
    assert choice() == ("rowmajor", False)
    # AMX (Sapphire Rapids and later) goes through ATen's pack() and brgemm, as before.
    assert choice(amx=True, avx512=True, avx512_bf16=True, avx512_fp16=True) == ("amx", True)
    # AVX-512 without BF16 (Skylake-X, Ice Lake): the fma kernel when forced, fp32 by default.
    assert choice(avx512=True) == ("avx512-fma", False)
    # AVX512-BF16 where vdpbf16ps is slower than FMAs (Intel without AMX, e.g. the Xeon of
    # docs/lab/2026-11-30-avx512-bf16-16bit-kernels.md): the fma kernel when forced, fp32
    # products by default.
    assert choice(avx512=True, avx512_bf16=bf16, avx512_fp16=True) == ("avx512-fma", False)
    if bf16:
        # vdpbf16ps faster than the fma kernel but not 1.5x the fp32 products: the dot kernel
        # when forced, fp32 products by default.
        assert choice(avx512=True, avx512_bf16=True, dot_outruns_fma=True) == ("avx512-dot",
                                                                               False)
        # 1.5x the fp32 products too (expected on AMD Zen 4/5): bf16 takes it by default.
        assert choice(avx512=True, avx512_bf16=True, dot_outruns_fma=True,
                      dot_outruns_fp32=True) == ("avx512-dot", True)


def test_this_cpu_takes_its_choice(monkeypatch):
    """With nothing forced, a call takes what the choice gives for this CPU's features."""
    monkeypatch.delenv("FLASHATTN_CPU_16BIT_KERNEL", raising=False)
    monkeypatch.delenv("FLASHATTN_CPU_16BIT_PRODUCTS", raising=False)
    for dtype in DTYPES_16:
        expected = TEST_OPS.cpu_16bit_choice(*TEST_OPS.cpu_16bit_features(dtype), dtype)
        assert BENCH_OPS.cpu_16bit_path(dtype) == expected


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES_16, ids=str)
def test_forced_kernel_runs_or_is_refused(monkeypatch, kernel, dtype):
    """FLASHATTN_CPU_16BIT_KERNEL forces a kernel: attention then runs on it (the product
    counter moves) or, where this CPU lacks it, fails with an error that says what is missing."""
    monkeypatch.setenv("FLASHATTN_CPU_16BIT_PRODUCTS", "1")
    monkeypatch.setenv("FLASHATTN_CPU_16BIT_KERNEL", kernel)
    q, k, v = (torch.randn(1, 70, 2, 32).to(dtype) for _ in range(3))
    # avx512-dot has no fp16 form: fp16 then takes avx512-fma.
    takes = "avx512-fma" if (kernel, dtype) == ("avx512-dot", torch.float16) else kernel
    if not runs_here(takes, dtype):
        with pytest.raises(RuntimeError, match=f"FLASHATTN_CPU_16BIT_KERNEL={kernel} needs"):
            flashattn.flash_attn_func(q, k, v, causal=True)
        return
    assert BENCH_OPS.cpu_16bit_path(dtype) == (takes, True)
    before = TEST_OPS.cpu_16bit_products_run(takes)
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    assert TEST_OPS.cpu_16bit_products_run(takes) > before
    monkeypatch.setenv("FLASHATTN_CPU_16BIT_PRODUCTS", "0")
    torch.testing.assert_close(out.float(), flashattn.flash_attn_func(q, k, v, causal=True)
                               .float(), rtol=0, atol=3e-2)


def test_bad_kernel_name_is_named(monkeypatch):
    monkeypatch.setenv("FLASHATTN_CPU_16BIT_PRODUCTS", "1")
    monkeypatch.setenv("FLASHATTN_CPU_16BIT_KERNEL", "avx1024")
    q = torch.randn(1, 8, 1, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="FLASHATTN_CPU_16BIT_KERNEL must be .*'avx1024'"):
        flashattn.flash_attn_func(q, q, q)


@pytest.mark.parametrize("dtype", [torch.float32, *DTYPES_16], ids=str)
def test_tile_products_rate(dtype):
    """The bench's ceiling: the forward's tile products on a hot tile, and what ran."""
    for path in (["fp32"] if dtype == torch.float32 else ["fp32", "16bit", "auto"]):
        gflops, what = BENCH_OPS.cpu_tile_products_gflops(dtype, 64, path, 0.01)
        assert gflops > 0.1, (path, gflops)
        if path == "fp32":
            assert what == "fp32 brgemm"
        elif path == "16bit":
            assert what == f"{'bf16' if dtype == torch.bfloat16 else 'fp16'} " \
                           f"{BENCH_OPS.cpu_16bit_path(dtype)[0]}"
