"""The warp-specialized TMA -> mbarrier -> wgmma GEMM test kernel on an H100/H200 (issue 31,
stage 3): bit for bit against torch.mm, and its TFLOP/s beside torch.mm's.

selftest/hopper_gemm_kernel.cuh is built by nvcc (-gencode arch=compute_90a,code=sm_90a) from
hopper_gemm_gpu.cu into a shared library loaded with ctypes, so it runs on torch's tensors and
stream. On integer-valued inputs every product and partial sum is exact in f32, so its f32 C
must equal torch.mm of the same inputs in f32 (TF32 off) bit for bit, whatever the summation
order; shapes include ragged M, N and K (the loads zero-fill, the store skips), B both N x K
(K-major) and K x N (MN-major), bf16 and f16, and each kernel configuration. Then a large
bf16 GEMM (default 8192^3) is timed with CUDA events, ours (f32 out) beside torch.mm's (bf16
out), in this process.

    python tests/cudasim/hopper_gemm.py [--size 8192] [--iters 20] [--compile-only]

--compile-only builds the library and stops (what a machine without a GPU can check); the build
fails if ptxas drops setmaxnreg (C7508) or spills, or (where cuobjdump is installed) if the SASS
lacks HGMMA, UTMALDG, UTMASTG or SYNCS. Exit status 1 if any check fails; on a GPU
other than compute capability 9.0 it prints SKIP and exits 0.
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build  # noqa: E402
from layout_check import nvcc_path  # noqa: E402,F401  (tests import it from here)

BUILD_DIR = build.DEFAULT_BUILD_DIR
SOURCE = os.path.join(build.SHIM_DIR, "hopper_gemm_gpu.cu")
# (f16, b_n_major, config, M, N, K); config 0: 2 consumers x 4 stages, 1: 2 x 2, 2: 1 x 2.
CHECKS = [
    (0, 0, 0, 256, 256, 512),
    (0, 0, 0, 1000, 1096, 1032),
    (0, 1, 0, 520, 776, 264),
    (1, 0, 1, 384, 264, 200),
    (1, 1, 2, 136, 392, 328),
    (0, 0, 2, 72, 8, 8),
    (0, 1, 1, 2048, 2048, 2048),
]


def build_library():
    nvcc = nvcc_path()
    if nvcc is None:
        raise SystemExit("nvcc not found: set CUDA_HOME")
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-O3", "-shared",
             "-Xcompiler", "-fPIC", "-Xptxas", "-v", "-I", os.path.join(build.SHIM_DIR, "selftest"),
             "-I", os.path.join(build.REPO_ROOT, "csrc")]
    inputs = [SOURCE, os.path.join(build.SHIM_DIR, "selftest", "hopper_gemm_kernel.cuh")] + sorted(
        glob.glob(os.path.join(build.REPO_ROOT, "csrc", "cuda", "*.cuh")) +
        glob.glob(os.path.join(build.REPO_ROOT, "csrc", "cuda", "*.h")))
    os.makedirs(BUILD_DIR, exist_ok=True)
    lib = os.path.join(BUILD_DIR, f"hopper_gemm_gpu_sm90a.{build.digest(inputs, [nvcc] + flags)}.so")
    if not os.path.exists(lib):
        out = subprocess.run([nvcc, *flags, SOURCE, "-o", lib + ".tmp"], capture_output=True, text=True)
        log = out.stdout + out.stderr
        if out.returncode != 0:
            raise SystemExit(f"nvcc failed:\n{log}")
        # ptxas -v: setmaxnreg needs the kernel's entry register count (C7508 otherwise), and a
        # GEMM main loop that spills is not the kernel this is meant to show.
        problems = [line for line in log.splitlines()
                    if "C7508" in line or re.search(r"[1-9]\d* bytes spill (stores|loads)", line)]
        if problems:
            raise SystemExit("ptxas:\n" + "\n".join(problems))
        sass_problem = check_sass(lib + ".tmp")
        if sass_problem:
            raise SystemExit(sass_problem)
        os.replace(lib + ".tmp", lib)
    return lib


def check_sass(lib):
    """The kernel's SASS must hold the Hopper instructions it is about (HGMMA, UTMALDG, UTMASTG,
    SYNCS), when cuobjdump is at hand; "" if so or if it cannot be checked."""
    cuobjdump = os.path.join(os.path.dirname(nvcc_path()), "cuobjdump")
    if not os.path.isfile(cuobjdump):
        return ""
    out = subprocess.run([cuobjdump, "-sass", lib], capture_output=True, text=True)
    if out.returncode != 0:
        return ""
    missing = [op for op in ("HGMMA", "UTMALDG", "UTMASTG", "SYNCS") if op not in out.stdout]
    return f"SASS lacks {', '.join(missing)}" if missing else ""


def integer_inputs(torch, m, n, k, f16, b_n_major, low=-3, high=4):
    dtype = torch.float16 if f16 else torch.bfloat16
    a = torch.randint(low, high, (m, k), device="cuda").to(dtype)
    b = torch.randint(low, high, (n, k), device="cuda").to(dtype)  # B as N x K
    b_arg = b.t().contiguous() if b_n_major else b
    return a, b, b_arg


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=8192, help="M = N = K of the timed GEMM")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()

    lib_path = build_library()
    if args.compile_only:
        print(f"built {lib_path}")
        return 0

    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("SKIP: needs a GPU of compute capability 9.0 (sm_90a)")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    lib = ctypes.CDLL(lib_path)
    lib.hopper_gemm_run.restype = ctypes.c_int
    lib.hopper_gemm_run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                    ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    error = ctypes.create_string_buffer(512)

    def ours(f16, b_n_major, config, a, b_arg, c):
        m, k = a.shape
        n = c.shape[1]
        rc = lib.hopper_gemm_run(f16, b_n_major, config, a.data_ptr(), b_arg.data_ptr(), c.data_ptr(),
                                 m, n, k, torch.cuda.current_stream().cuda_stream, error, len(error))
        if rc != 0:
            raise RuntimeError(error.value.decode())

    torch.manual_seed(0)
    failures = 0
    for f16, b_n_major, config, m, n, k in CHECKS:
        a, b, b_arg = integer_inputs(torch, m, n, k, f16, b_n_major)
        c = torch.full((m, n), float("nan"), device="cuda")
        ours(f16, b_n_major, config, a, b_arg, c)
        want = torch.mm(a.float(), b.float().t())
        torch.cuda.synchronize()
        same = torch.equal(c.view(torch.int32), want.view(torch.int32))
        name = (f"{'f16' if f16 else 'bf16'} B {'K x N' if b_n_major else 'N x K'} config {config} "
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

    def timed(fn):
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / args.iters * 1e-3

    t_ours = timed(lambda: ours(0, 0, 0, a, b_arg, c))
    same = torch.equal(c, torch.mm(a.float(), b.float().t()))
    t_torch = timed(lambda: torch.mm(a, b.t()))
    print(f"{'PASS' if same else 'FAIL'} bf16 B N x K config 0 {s} x {s} x {s} (the timed one)")
    failures += not same
    print(f"hopper_gemm {s}^3 bf16 -> f32: {t_ours * 1e3:.3f} ms, {flops / t_ours / 1e12:.0f} TFLOP/s; "
          f"torch.mm bf16 -> bf16: {t_torch * 1e3:.3f} ms, {flops / t_torch / 1e12:.0f} TFLOP/s "
          f"({t_torch / t_ours:.2f}x of torch.mm's speed)")
    print(f"hopper gemm: {len(CHECKS) + 1 - failures} of {len(CHECKS) + 1} checks agree with torch.mm")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
