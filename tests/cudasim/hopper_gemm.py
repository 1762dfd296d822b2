"""The warp-specialized TMA -> mbarrier -> wgmma GEMM test kernel on an H100/H200 (issue 31,
stage 3): bit for bit against torch.mm, and its TFLOP/s beside torch.mm's.

selftest/hopper_gemm_kernel.cuh is built by nvcc (-gencode arch=compute_90a,code=sm_90a) from
hopper_gemm_gpu.cu into a shared library loaded with ctypes, so it runs on torch's tensors and
stream. On integer-valued inputs every product and partial sum is exact in f32, so its f32 C
must equal torch.mm of the same inputs in f32 (TF32 off) bit for bit, whatever the summation
order; shapes include ragged M, N and K (the loads zero-fill, the store skips), B both N x K
(K-major) and K x N (MN-major), bf16, f16 and e4m3 (B N x K only: 8-bit wgmma operands are
K-major), and each kernel configuration. (e4m3: hardware's FP8 accumulation is not IEEE f32
summation in general, but these small integers keep every partial sum exact.) Then large
GEMMs (default 8192^3) are timed with CUDA events in this process: bf16 ours (f32 out) beside
torch.mm's (bf16 out), and e4m3 ours (f32 out) beside torch._scaled_mm's (unit scales, bf16
out).

    python tests/cudasim/hopper_gemm.py [--size 8192] [--iters 20] [--compile-only]

--compile-only builds the library and stops (what a machine without a GPU can check); the build
fails if ptxas drops setmaxnreg (C7508), serializes wgmma (C7520), spills or keeps a stack frame,
or (where cuobjdump is installed) if the SASS lacks HGMMA, UTMALDG, UTMASTG or SYNCS or uses local
memory (tests/cudasim/sm90a_library.py). Exit status 1 if any check fails; on a GPU
other than compute capability 9.0 it prints SKIP and exits 0.
"""
import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build  # noqa: E402
from layout_check import nvcc_path  # noqa: E402,F401  (tests import it from here)
from sm90a_library import build_library, library_headers, on_sm90, seconds_per_call  # noqa: E402

SOURCE = os.path.join(build.SHIM_DIR, "hopper_gemm_gpu.cu")
SELFTEST_DIR = os.path.join(build.SHIM_DIR, "selftest")
# wgmma, TMA load, TMA store, mbarrier ops: what the kernel is about.
SASS_OPS = ("HGMMA", "UTMALDG", "UTMASTG", "SYNCS")
# (dtype, b_n_major, config, M, N, K); dtype 0: bf16, 1: f16, 2: e4m3; config 0: 2 consumers x
# 4 stages, 1: 2 x 2, 2: 1 x 2.
BF16, F16, E4M3 = 0, 1, 2
CHECKS = [
    (0, 0, 0, 256, 256, 512),
    (0, 0, 0, 1000, 1096, 1032),
    (0, 1, 0, 520, 776, 264),
    (1, 0, 1, 384, 264, 200),
    (1, 1, 2, 136, 392, 328),
    (0, 0, 2, 72, 8, 8),
    (0, 1, 1, 2048, 2048, 2048),
    (2, 0, 0, 256, 256, 1024),
    (2, 0, 0, 1000, 1096, 1040),
    (2, 0, 1, 384, 264, 208),
    (2, 0, 2, 72, 8, 16),
    (2, 0, 0, 2048, 2048, 2048),
]


def integer_inputs(torch, m, n, k, dtype_code, b_n_major, low=-3, high=4):
    dtype = {BF16: torch.bfloat16, F16: torch.float16, E4M3: torch.float8_e4m3fn}[dtype_code]
    a = torch.randint(low, high, (m, k), device="cuda").float().to(dtype)
    b = torch.randint(low, high, (n, k), device="cuda").float().to(dtype)  # B as N x K
    b_arg = b.t().contiguous() if b_n_major else b
    return a, b, b_arg


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=8192, help="M = N = K of the timed GEMM")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()

    lib_path, _ = build_library(SOURCE, "hopper_gemm_gpu", SASS_OPS,
                                [os.path.join(SELFTEST_DIR, "hopper_gemm_kernel.cuh"),
                                 *library_headers()], [SELFTEST_DIR])
    if args.compile_only:
        print(f"built {lib_path}")
        return 0

    import torch
    if not on_sm90():
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    lib = ctypes.CDLL(lib_path)
    lib.hopper_gemm_run.restype = ctypes.c_int
    lib.hopper_gemm_run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                    ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    error = ctypes.create_string_buffer(512)

    def ours(dtype, b_n_major, config, a, b_arg, c):
        m, k = a.shape
        n = c.shape[1]
        rc = lib.hopper_gemm_run(dtype, b_n_major, config, a.data_ptr(), b_arg.data_ptr(), c.data_ptr(),
                                 m, n, k, torch.cuda.current_stream().cuda_stream, error, len(error))
        if rc != 0:
            raise RuntimeError(error.value.decode())

    torch.manual_seed(0)
    failures = 0
    for dtype, b_n_major, config, m, n, k in CHECKS:
        a, b, b_arg = integer_inputs(torch, m, n, k, dtype, b_n_major)
        c = torch.full((m, n), float("nan"), device="cuda")
        ours(dtype, b_n_major, config, a, b_arg, c)
        want = torch.mm(a.float(), b.float().t())
        torch.cuda.synchronize()
        same = torch.equal(c.view(torch.int32), want.view(torch.int32))
        name = (f"{('bf16', 'f16', 'e4m3')[dtype]} B {'K x N' if b_n_major else 'N x K'} config {config} "
                f"{m} x {n} x {k}")
        if same:
            print(f"PASS {name}")
        else:
            failures += 1
            bad = (c != want) | torch.isnan(c)
            where = bad.nonzero()[0].tolist()
            print(f"FAIL {name}: {int(bad.sum())} of {m * n} differ, first C{where} = "
                  f"{c[where[0], where[1]].item()} (torch.mm {want[where[0], where[1]].item()})")

    # Timing: bf16, B as N x K (K of attention), the fast configuration, vs torch.mm (bf16 out).
    s = args.size
    a, b, b_arg = integer_inputs(torch, s, s, s, 0, 0, low=-2, high=3)
    c = torch.empty((s, s), device="cuda")
    flops = 2.0 * s * s * s

    t_ours = seconds_per_call(lambda: ours(0, 0, 0, a, b_arg, c), args.iters)
    same = torch.equal(c, torch.mm(a.float(), b.float().t()))
    t_torch = seconds_per_call(lambda: torch.mm(a, b.t()), args.iters)
    print(f"{'PASS' if same else 'FAIL'} bf16 B N x K config 0 {s} x {s} x {s} (the timed one)")
    failures += not same
    print(f"hopper_gemm {s}^3 bf16 -> f32: {t_ours * 1e3:.3f} ms, {flops / t_ours / 1e12:.0f} TFLOP/s; "
          f"torch.mm bf16 -> bf16: {t_torch * 1e3:.3f} ms, {flops / t_torch / 1e12:.0f} TFLOP/s "
          f"({t_torch / t_ours:.2f}x of torch.mm's speed)")

    # e4m3, B as N x K, the fast configuration, vs torch._scaled_mm (cuBLASLt FP8, bf16 out).
    a8, b8, b8_arg = integer_inputs(torch, s, s, s, E4M3, 0, low=-2, high=3)
    t_ours8 = seconds_per_call(lambda: ours(E4M3, 0, 0, a8, b8_arg, c), args.iters)
    same = torch.equal(c, torch.mm(a8.float(), b8.float().t()))
    print(f"{'PASS' if same else 'FAIL'} e4m3 B N x K config 0 {s} x {s} x {s} (the timed one)")
    failures += not same
    one = torch.ones((), device="cuda")
    try:
        t_scaled = seconds_per_call(
            lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            args.iters)
        theirs = (f"torch._scaled_mm e4m3 -> bf16: {t_scaled * 1e3:.3f} ms, "
                  f"{flops / t_scaled / 1e12:.0f} TFLOP/s ({t_scaled / t_ours8:.2f}x of _scaled_mm's speed)")
    except (RuntimeError, TypeError) as e:  # a torch without it, or without this layout
        theirs = f"torch._scaled_mm not timed: {e}".splitlines()[0]
    print(f"hopper_gemm {s}^3 e4m3 -> f32: {t_ours8 * 1e3:.3f} ms, {flops / t_ours8 / 1e12:.0f} TFLOP/s; "
          + theirs)
    print(f"hopper gemm: {len(CHECKS) + 2 - failures} of {len(CHECKS) + 2} checks agree with torch.mm")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
