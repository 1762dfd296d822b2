"""The sm_90a attention backward (csrc/cuda/hopper/bwd_sm90_*, issue 31 stage 5) on an
H100/H200: a correctness sample of dQ, dK, dV against float64 autograd with the FlashAttention
tolerance (3x PyTorch's own error in the 16-bit type), deterministic dQ run twice bit for bit,
then its TFLOP/s beside SDPA's cuDNN and flash backward in the same process.

tests/cudasim/hopper_bwd_gpu.cu is built by nvcc (-gencode arch=compute_90a,code=sm_90a) into a
shared library loaded with ctypes, so it runs on torch's tensors and stream.

    python tests/cudasim/hopper_bwd.py [--iters 20] [--compile-only] [--ptxas]

--compile-only builds the library and stops (what a machine without a GPU can check); the build
fails if ptxas reports C7508, C7520 or any spill / stack frame, or (where cuobjdump is installed)
if the SASS lacks HGMMA, UTMALDG, UBLKCP, UBLKRED, STSM or SYNCS, or uses local memory. --ptxas
prints ptxas's per-kernel registers / spills / shared-memory lines. Exit status 1 if any check
fails; on a GPU other than compute capability 9.0 it prints SKIP and exits 0.
"""
import ctypes
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build  # noqa: E402
from sm90a_library import attention_runner_start, tflops_row, torch_attention  # noqa: E402

SOURCE = os.path.join(build.SHIM_DIR, "hopper_bwd_gpu.cu")
# (f16, head_dim, causal, deterministic, batch, heads_q, heads_kv, seqlen_q, seqlen_k)
CHECKS = [
    (0, 128, 0, 0, 2, 4, 4, 1000, 1000),
    (0, 128, 1, 0, 1, 4, 2, 777, 1029),
    (0, 64, 0, 0, 1, 8, 1, 129, 4097),
    (0, 64, 1, 0, 3, 2, 2, 513, 255),
    (1, 128, 1, 0, 1, 2, 2, 2048, 2048),
    (1, 64, 0, 0, 2, 2, 1, 1, 63),
    (0, 128, 1, 0, 1, 1, 1, 7, 7),
    (0, 128, 0, 1, 1, 2, 1, 600, 700),
]
# wgmma, TMA load, bulk copy (row stats), bulk reduce (dQ), stmatrix (dS), mbarrier ops.
SASS_OPS = ("HGMMA", "UTMALDG", "UBLKCP", "UBLKRED", "STSM", "SYNCS")
# Timed: bf16, B * N = 16k tokens, hidden 2048 (bench/RESULTS.md's setting).
TIMED = [(128, 0, 4096), (128, 1, 4096), (64, 0, 4096), (64, 1, 4096)]


def main():
    started = attention_runner_start(__doc__.split("\n")[0], SOURCE, "hopper_bwd_gpu", SASS_OPS)
    if started is None:
        return 0
    args, lib_path = started

    import torch
    import torch.nn.functional as F
    lib = ctypes.CDLL(lib_path)
    lib.hopper_bwd_workspace_floats.restype = ctypes.c_longlong
    lib.hopper_bwd_workspace_floats.argtypes = [ctypes.c_int] * 6
    lib.hopper_bwd_run.restype = ctypes.c_int
    lib.hopper_bwd_run.argtypes = ([ctypes.c_int] * 4 + [ctypes.c_void_p] * 10 + [ctypes.c_int] * 5 +
                                   [ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p,
                                    ctypes.c_int])
    error = ctypes.create_string_buffer(512)

    def ours(q, k, v, o, lse, do, causal, deterministic=False, grads=None):
        b, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        dq, dk, dv = grads if grads else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        floats = lib.hopper_bwd_workspace_floats(d, int(deterministic), b, hq, sq, sk)
        ws = torch.empty(floats, device="cuda", dtype=torch.float32)
        tensors = (q, k, v, o, do, dq, dk, dv)
        strides = (ctypes.c_longlong * 24)(*[t.stride(i) for t in tensors for i in (0, 1, 2)])
        rc = lib.hopper_bwd_run(int(q.dtype == torch.float16), d, int(causal), int(deterministic),
                                q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do.data_ptr(),
                                lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), strides,
                                b, sq, sk, hq, hkv, 1.0 / math.sqrt(d), ws.data_ptr(),
                                torch.cuda.current_stream().cuda_stream, error, len(error))
        if rc != 0:
            raise RuntimeError(error.value.decode())
        return dq, dk, dv

    def reference(q, k, v, do, causal, dtype):
        """O, LSE, dQ, dK, dV by torch_attention in `dtype`."""
        qd, kd, vd = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
        o, lse = torch_attention(qd, kd, vd, causal)
        o.backward(do.to(dtype))
        return o.detach(), lse.detach(), qd.grad, kd.grad, vd.grad

    torch.manual_seed(0)
    failures = 0
    for f16, d, causal, det, b, hq, hkv, sq, sk in CHECKS:
        dtype = torch.float16 if f16 else torch.bfloat16
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
        do = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
        o64, lse64, *want = reference(q, k, v, do, causal, torch.float64)
        _, _, *low = reference(q, k, v, do, causal, dtype)
        o, lse = o64.to(dtype).contiguous(), lse64.float().contiguous()
        grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        ours(q, k, v, o, lse, do, causal, det, grads)
        ok = True
        parts = []
        for name, got, w, lo in zip(("dQ", "dK", "dV"), grads, want, low):
            err = (got.double() - w).abs().max().item()
            err_low = (lo.double() - w).abs().max().item()
            good = err <= 3 * err_low + 1e-5 and not got.isnan().any()
            ok = ok and good
            parts.append(f"{name} err {err:.3g} (torch {err_low:.3g})")
        if det:
            again = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
            ours(q, k, v, o, lse, do, causal, det, again)
            same = all(torch.equal(x, y) for x, y in zip(grads, again))
            ok = ok and same
            parts.append(f"rerun bitwise equal {same}")
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {'f16' if f16 else 'bf16'} d={d} causal={causal} det={det} B={b} "
              f"Hq={hq} Hkv={hkv} Sq={sq} Sk={sk}: " + ", ".join(parts))

    for d, causal, n in TIMED:
        h = 2048 // d
        b = 16384 // n
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o = torch.randn_like(q)
        lse = torch.randn(b, h, n, device="cuda", dtype=torch.float32) + 10.0
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))

        def sdpa_backward():
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
            return lambda: torch.autograd.grad(out, (qt, kt, vt), do.transpose(1, 2), retain_graph=True)

        tflops_row(f"backward d={d} N={n} causal={causal}:",
                   2.5 * 4.0 * b * h * n * n * d / (2 if causal else 1),  # backward = 2.5 forwards
                   lambda: ours(q, k, v, o, lse, do, causal, grads=grads), sdpa_backward, args.iters)
    print(f"hopper backward: {len(CHECKS) - failures} of {len(CHECKS)} checks pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
