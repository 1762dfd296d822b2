"""The sm_90a attention forward (csrc/cuda/hopper/, issue 31 stage 4) on an H100/H200: a
correctness sample against a float64 reference with the FlashAttention tolerance, then its
TFLOP/s beside SDPA's cuDNN and flash backends in the same process.

tests/cudasim/hopper_fwd_gpu.cu is built by nvcc (-gencode arch=compute_90a,code=sm_90a) into a
shared library loaded with ctypes, so it runs on torch's tensors and stream.

    python tests/cudasim/hopper_fwd.py [--iters 20] [--compile-only] [--ptxas]

--compile-only builds the library and stops (what a machine without a GPU can check); the build
fails if ptxas reports C7508 (setmaxnreg without a known entry register count), C7520 (wgmma
serialized: a register access or a divergent path between wgmma.fence and the MMAs) or any
spill / stack frame, or (where cuobjdump is installed) if the SASS lacks HGMMA, UTMALDG, UTMASTG,
STSM or SYNCS, or uses local memory (tests/cudasim/sm90a_library.py). --ptxas prints ptxas's per-kernel registers / spills lines. Exit status 1 if any check
fails; on a GPU other than compute capability 9.0 it prints SKIP and exits 0.
"""
import ctypes
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build  # noqa: E402
from sm90a_library import attention_runner_start, tflops_row, torch_attention  # noqa: E402

SOURCE = os.path.join(build.SHIM_DIR, "hopper_fwd_gpu.cu")
# (f16, head_dim, causal, batch, heads_q, heads_kv, seqlen_q, seqlen_k, softcap, window):
# softcap and windows (left, right; bottom-right aligned) are built for bf16 only.
CHECKS = [
    (0, 128, 0, 2, 4, 4, 1000, 1000, 0, None),
    (0, 128, 1, 1, 4, 2, 777, 1029, 0, None),
    (0, 64, 0, 1, 8, 1, 129, 4097, 0, None),
    (0, 64, 1, 3, 2, 2, 513, 255, 0, None),
    (1, 128, 1, 1, 2, 2, 2048, 2048, 0, None),
    (1, 64, 0, 2, 2, 1, 1, 63, 0, None),
    (0, 128, 1, 1, 1, 1, 7, 7, 0, None),
    (0, 128, 0, 1, 2, 1, 300, 600, 1.5, None),
    (0, 64, 1, 2, 2, 2, 600, 300, 1.5, None),
    (0, 128, 0, 1, 2, 2, 1000, 1500, 0, (256, 0)),
    (0, 64, 0, 2, 2, 1, 700, 500, 0, (100, 37)),
]
# wgmma, TMA load, TMA store, stmatrix, mbarrier ops: what the kernel is about.
SASS_OPS = ("HGMMA", "UTMALDG", "UTMASTG", "STSM", "SYNCS")
# Timed: bf16, B * N = 16k tokens, hidden 2048 (bench/RESULTS.md's setting).
TIMED = [(128, 0, 4096), (128, 1, 4096), (64, 0, 4096), (64, 1, 4096)]


def main():
    started = attention_runner_start(__doc__.split("\n")[0], SOURCE, "hopper_fwd_gpu", SASS_OPS)
    if started is None:
        return 0
    args, lib_path = started

    import torch
    import torch.nn.functional as F
    lib = ctypes.CDLL(lib_path)
    lib.hopper_fwd_run.restype = ctypes.c_int
    lib.hopper_fwd_run.argtypes = ([ctypes.c_int] * 3 + [ctypes.c_void_p] * 6 +
                                   [ctypes.c_int] * 5 + [ctypes.c_float, ctypes.c_float] +
                                   [ctypes.c_int] * 2 + [ctypes.c_void_p, ctypes.c_char_p,
                                                         ctypes.c_int])
    error = ctypes.create_string_buffer(512)

    def ours(q, k, v, causal, o=None, lse=None, softcap=0.0, window=None):
        b, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        o = torch.empty_like(q) if o is None else o
        lse = torch.empty((b, hq, sq), device="cuda", dtype=torch.float32) if lse is None else lse
        strides = (ctypes.c_longlong * 12)(*[t.stride(i) for t in (q, k, v, o) for i in (0, 1, 2)])
        rc = lib.hopper_fwd_run(int(q.dtype == torch.float16), d, int(causal), q.data_ptr(),
                                k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), strides,
                                b, sq, sk, hq, hkv, 1.0 / math.sqrt(d), softcap,
                                *(window if window else (-1, -1)),
                                torch.cuda.current_stream().cuda_stream, error, len(error))
        if rc != 0:
            raise RuntimeError(error.value.decode())
        return o, lse

    def reference(q, k, v, causal, dtype, softcap=0.0, window=None):
        return torch_attention(*(t.to(dtype) for t in (q, k, v)), causal, softcap, window)

    torch.manual_seed(0)
    failures = 0
    for f16, d, causal, b, hq, hkv, sq, sk, softcap, window in CHECKS:
        dtype = torch.float16 if f16 else torch.bfloat16
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
        o = torch.full_like(q, float("nan"))
        lse = torch.full((b, hq, sq), float("nan"), device="cuda")
        ours(q, k, v, causal, o, lse, softcap, window)
        want, want_lse = reference(q, k, v, causal, torch.float64, softcap, window)
        low, _ = reference(q, k, v, causal, dtype, softcap, window)
        err = (o.double() - want).abs().max().item()
        err_low = (low.double() - want).abs().max().item()
        finite = want_lse.isfinite()
        lse_ok = bool(((lse.double() - want_lse).abs()[finite] <= 1e-3).all()) and bool(
            (lse[~finite] == float("-inf")).all())
        ok = err <= 2 * err_low + 1e-5 and lse_ok and not o.isnan().any()
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {'f16' if f16 else 'bf16'} d={d} causal={causal} B={b} "
              f"Hq={hq} Hkv={hkv} Sq={sq} Sk={sk} softcap={softcap} window={window}: "
              f"O err {err:.3g} "
              f"(torch {dtype}: {err_low:.3g}), "
              f"LSE ok {lse_ok}")

    for d, causal, n in TIMED:
        h = 2048 // d
        b = 16384 // n
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        tflops_row(f"d={d} N={n} causal={causal}:", 4.0 * b * h * n * n * d / (2 if causal else 1),
                   lambda: ours(q, k, v, causal),
                   lambda: lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal)),
                   args.iters)
    print(f"hopper forward: {len(CHECKS) - failures} of {len(CHECKS)} checks pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
