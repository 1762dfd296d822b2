"""The sm_90a FP8 (e4m3) forward, d = 128 (csrc/cuda/hopper/, issue 31 stage 6) on an H100/H200:
a correctness sample against float64 attention on the dequantized inputs with P rounded to e4m3
as the kernel rounds it (and a looser bound against P unrounded), then its TFLOP/s beside
cuDNN's FP8 SDPA where this torch takes float8 inputs, and beside the bf16 sm_90a forward's
cuDNN / flash SDPA on the same shapes in bf16.

tests/cudasim/hopper_fp8_fwd_gpu.cu is built by nvcc (-gencode arch=compute_90a,code=sm_90a) into
a shared library loaded with ctypes, so it runs on torch's tensors and stream.

    python tests/cudasim/hopper_fp8_fwd.py [--iters 20] [--compile-only] [--ptxas]

--compile-only builds the library and stops (what a machine without a GPU can check); the build
fails on C7508, C7520, any spill or stack frame, or (where cuobjdump is installed) if the SASS
lacks QGMMA (FP8 wgmma), UTMALDG, UTMASTG, STSM or SYNCS, or uses local memory
(tests/cudasim/sm90a_library.py). Exit status 1 if any check fails; on a GPU other than compute
capability 9.0 it prints SKIP and exits 0.
"""
import ctypes
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build  # noqa: E402
from sm90a_library import attention_runner_start, seconds_per_call  # noqa: E402

SOURCE = os.path.join(build.SHIM_DIR, "hopper_fp8_fwd_gpu.cu")
D = 128
BLOCK_N = 128  # FwdSm90Config's key tile at d = 128: the kernel's running max moves per tile
# (causal, batch, heads_q, heads_kv, seqlen_q, seqlen_k, descale)
CHECKS = [
    (0, 2, 4, 4, 1000, 1000, False),
    (1, 1, 4, 2, 777, 1029, True),
    (0, 1, 8, 1, 129, 4097, True),
    (1, 3, 2, 2, 513, 255, False),
    (1, 1, 1, 1, 7, 7, False),
    (0, 2, 2, 1, 1, 63, True),
]
SASS_OPS = ("QGMMA", "UTMALDG", "UTMASTG", "STSM", "SYNCS")
TIMED = [(0, 4096), (1, 4096), (0, 8192), (1, 8192)]  # (causal, N); B * N = 16k tokens, 16 heads


def reference(q, k, v, causal, descales):
    """(O with P rounded to e4m3 per key tile as the kernel rounds it, O with P unrounded, the
    bound P's rounding puts on their difference, LSE), float64, bottom-right causal. descales:
    (q, k, v) [B, Hkv] or None."""
    import torch
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
    b, hq, sq, _ = qd.shape
    hkv, sk = kd.shape[1], kd.shape[2]
    g = hq // hkv
    kd, vd = kd.repeat_interleave(g, 1), vd.repeat_interleave(g, 1)
    s = (qd @ kd.transpose(-1, -2)) / math.sqrt(D)
    v_scale = torch.ones(b, hq, 1, 1, dtype=torch.float64, device=q.device)
    if descales is not None:
        qs, ks, vs = (x.double().repeat_interleave(g, 1)[:, :, None, None] for x in descales)
        s = s * qs * ks
        v_scale = vs
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    # The kernel's running max: tiles visited last first, so tile n sees the max of tiles >= n.
    tiles = (sk + BLOCK_N - 1) // BLOCK_N
    tile_max = torch.stack([s[..., n * BLOCK_N:(n + 1) * BLOCK_N].amax(-1) for n in range(tiles)], -1)
    running = tile_max.flip(-1).cummax(-1).values.flip(-1)  # [B, H, Sq, tiles]
    m_tile = running.repeat_interleave(BLOCK_N, -1)[..., :sk]
    finite = m_tile.isfinite()
    p_exact = torch.where(m.isfinite(), (s - m).exp(), torch.zeros_like(s))
    shifted = torch.where(finite, (s - m_tile).exp(), torch.zeros_like(s))
    p_q = shifted.float().clamp(max=448).to(torch.float8_e4m3fn).double() * torch.where(
        finite, (m_tile - m).exp(), torch.zeros_like(s))
    l = p_exact.sum(-1, keepdim=True)
    # A row that sees no key (causal, Sq > Sk): O = 0 and LSE = -inf, as every forward writes it.
    l_safe = torch.where(l > 0, l, torch.ones_like(l))
    o_q = (p_q @ vd) / l_safe * v_scale
    o_exact = (p_exact @ vd) / l_safe * v_scale
    # How far rounding P can move O: half an ulp of each P (2^-4 relative), 2^-10 at least.
    p_slack = (shifted * 2 ** -4).clamp(min=2 ** -10) * torch.where(finite, (m_tile - m).exp(), torch.zeros_like(s))
    bound = (p_slack @ vd.abs()) / l_safe * v_scale
    lse = torch.where(l > 0, m + l_safe.log(), torch.full_like(l, float("-inf"))).squeeze(-1)
    return o_q.transpose(1, 2), o_exact.transpose(1, 2), bound.transpose(1, 2), lse


def main():
    started = attention_runner_start(__doc__.split("\n")[0], SOURCE, "hopper_fp8_fwd_gpu", SASS_OPS)
    if started is None:
        return 0
    args, lib_path = started

    import torch
    import torch.nn.functional as F
    lib = ctypes.CDLL(lib_path)
    lib.hopper_fp8_fwd_run.restype = ctypes.c_int
    lib.hopper_fp8_fwd_run.argtypes = ([ctypes.c_int] + [ctypes.c_void_p] * 6 + [ctypes.c_int] * 5 +
                                       [ctypes.c_float] + [ctypes.c_void_p] * 4 +
                                       [ctypes.c_char_p, ctypes.c_int])
    error = ctypes.create_string_buffer(512)

    def ours(q, k, v, causal, o=None, lse=None, descales=None):
        b, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        o = torch.empty(q.shape, device="cuda", dtype=torch.bfloat16) if o is None else o
        lse = torch.empty((b, hq, sq), device="cuda", dtype=torch.float32) if lse is None else lse
        strides = (ctypes.c_longlong * 12)(*[t.stride(i) for t in (q, k, v, o) for i in (0, 1, 2)])
        ptrs = [x.data_ptr() if x is not None else None for x in (descales or (None, None, None))]
        rc = lib.hopper_fp8_fwd_run(int(causal), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                    lse.data_ptr(), strides, b, sq, sk, hq, hkv, 1.0 / math.sqrt(d), *ptrs,
                                    torch.cuda.current_stream().cuda_stream, error, len(error))
        if rc != 0:
            raise RuntimeError(error.value.decode())
        return o, lse

    torch.manual_seed(0)
    failures = 0
    for causal, b, hq, hkv, sq, sk, with_descale in CHECKS:
        q = torch.randn(b, sq, hq, D, device="cuda").to(torch.float8_e4m3fn)
        k = torch.randn(b, sk, hkv, D, device="cuda").to(torch.float8_e4m3fn)
        v = torch.randn(b, sk, hkv, D, device="cuda").to(torch.float8_e4m3fn)
        descales = tuple(torch.rand(b, hkv, device="cuda") + 0.5 for _ in range(3)) if with_descale else None
        o = torch.full((b, sq, hq, D), float("nan"), device="cuda", dtype=torch.bfloat16)
        lse = torch.full((b, hq, sq), float("nan"), device="cuda")
        ours(q, k, v, causal, o, lse, descales)
        torch.cuda.synchronize()
        want, want_exact, bound, want_lse = reference(q, k, v, causal, descales)
        err = (o.double() - want).abs().max().item()
        rounding = (want.to(torch.bfloat16).double() - want).abs().max().item()
        excess = (o.double() - want_exact).abs() / (bound + 2 ** -8 * want_exact.abs() + 1e-3)
        err_exact = excess.max().item()
        finite = want_lse.isfinite()
        lse_ok = bool(((lse.double() - want_lse).abs()[finite] <= 1e-3).all()) and bool(
            (lse[~finite] == float("-inf")).all())
        # FP8 wgmma's accumulation is not IEEE f32 (about 14 bits, docs/lab/2026-12-04-hopper-fp8-
        # primitives.md): the strict comparison is reported, the looser one decides on hardware.
        ok = err_exact <= 1 and lse_ok and not o.isnan().any()
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} e4m3 d={D} causal={causal} B={b} Hq={hq} Hkv={hkv} Sq={sq} Sk={sk} "
              f"descale={with_descale}: O err {err:.3g} vs P rounded (bf16 rounding {rounding:.3g}, "
              f"ratio {err / rounding if rounding else 0:.2f}), vs P unrounded {err_exact:.2f} of its "
              f"bound, LSE ok {lse_ok}")

    from torch.nn.attention import SDPBackend, sdpa_kernel
    h = 16
    for causal, n in TIMED:
        b = 16384 // n
        q8, k8, v8 = (torch.randn(b, n, h, D, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
        flops = 4.0 * b * h * n * n * D / (2 if causal else 1)
        row = [f"d={D} N={n} causal={causal}:"]
        t = seconds_per_call(lambda: ours(q8, k8, v8, causal), args.iters)
        row.append(f"hopper fp8 {flops / t / 1e12:.0f}")
        qt8, kt8, vt8 = (x.transpose(1, 2) for x in (q8, k8, v8))
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                t = seconds_per_call(lambda: F.scaled_dot_product_attention(qt8, kt8, vt8, is_causal=bool(causal)),
                                     args.iters)
            row.append(f"cudnn fp8 {flops / t / 1e12:.0f}")
        except (RuntimeError, TypeError, NotImplementedError) as e:
            row.append(f"cudnn fp8 n/a ({str(e).splitlines()[0][:60]})")
        qt, kt, vt = (x.to(torch.bfloat16) for x in (qt8, kt8, vt8))
        for name, backend in (("cudnn bf16", SDPBackend.CUDNN_ATTENTION), ("flash bf16", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    t = seconds_per_call(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal)),
                                         args.iters)
                row.append(f"{name} {flops / t / 1e12:.0f}")
            except RuntimeError as e:
                row.append(f"{name} n/a ({str(e).splitlines()[0][:60]})")
        print(" ".join(row) + " TFLOP/s")
    print(f"hopper fp8 forward: {len(CHECKS) - failures} of {len(CHECKS)} checks pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
