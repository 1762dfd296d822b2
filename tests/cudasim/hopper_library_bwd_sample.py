"""The sm_90a backward through the library on a GPU (tools/gpu_check.sh, after hopper-lib):
torch.ops.flashattn.fwd and .bwd with FLASHATTN_CUDA_HOPPER=1, which the plans
(csrc/cuda/plan_fwd_sm90.h, plan_bwd_sm90.h) send to the Hopper kernels on compute capability 9.0.

    FLASHATTN_CUDA_HOPPER=1 python tests/cudasim/hopper_library_bwd_sample.py

For each case: dq, dk and dv against float64 autograd through the reference within 3x PyTorch's
own error in the dtype (tests/checks.check_backward, outputs poisoned first), and the profiler's
kernel names show that the Hopper backward ran (bwd_sm90_kernel); deterministic=True twice gives
the same bits; a variable-length batch and a seqused one, per sequence, with NaN in the rows no
sequence uses; dropout against the keep mask the CPU draws for the same rng_state; calls it does
not take (a gradient of the LSE, ALiBi with a local window) run the sm_80 backward. Then the
library's forward + backward TFLOP/s at B·N = 16k, hidden 2048, d = 128, N = 4096, causal and
not (FLOPs: 3.5x the forward's 4·B·H·N²·d, halved when causal). Exits 1 on any failure; on a GPU
other than compute capability 9.0, prints SKIP and exits 0.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE)))  # tests/: checks, tolerance
os.environ.setdefault("FLASHATTN_POISON_OUTPUTS", "1")  # before flashattn loads

import torch  # noqa: E402

from library_sample import assert_ran, kernels_run, run_sample, tflops  # noqa: E402

# (dtype, d, mask, B, Sq, Sk, Hq, Hkv, deterministic): both dtypes and head dims, causal in both
# alignments, local windows ((16, 5); (20, 0) as causal with a left edge), ALiBi (slopes [Hq];
# [B, Hq] with causal), softcap (2.5; with causal), ragged lengths, Sq != Sk both ways, GQA, one
# query, a long sequence.
CASES = [
    (torch.bfloat16, 128, "none", 2, 1000, 1000, 8, 8, False),
    (torch.float16, 64, "none", 1, 65, 129, 4, 1, False),
    (torch.bfloat16, 64, "causal", 2, 129, 63, 2, 2, False),
    (torch.float16, 128, "causal", 1, 7, 2049, 4, 2, False),
    (torch.bfloat16, 128, "causal_top_left", 1, 513, 257, 3, 1, False),
    (torch.float16, 64, "causal_top_left", 1, 1, 1, 1, 1, False),
    (torch.bfloat16, 128, "causal", 1, 2048, 2048, 4, 4, True),
    (torch.float16, 128, "window", 1, 1000, 700, 4, 2, False),
    (torch.bfloat16, 64, "window_causal", 2, 513, 257, 2, 1, True),
    (torch.bfloat16, 64, "alibi", 2, 1000, 700, 4, 2, False),
    (torch.float16, 128, "alibi_batch_causal", 2, 257, 1000, 4, 1, True),
    (torch.bfloat16, 128, "alibi", 1, 129, 1000, 2, 2, False),
    (torch.bfloat16, 128, "softcap", 2, 1000, 700, 4, 2, False),
    (torch.float16, 64, "softcap_causal", 1, 513, 2049, 4, 1, True),
]


def check_cases(tally):
    from checks import MASKS, check_backward
    from executors import make_executor

    cuda = make_executor("cuda")
    for dtype, d, mask, b, sq, sk, hq, hkv, deterministic in CASES:
        name = (f"{str(dtype)[6:]} d={d} {mask} B={b} Sq={sq} Sk={sk} Hq={hq} Hkv={hkv}"
                f"{' deterministic' if deterministic else ''}")
        q = torch.randn(b, sq, hq, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
        with tally.case(name):
            grads = []
            names = kernels_run(lambda: grads.append(
                check_backward(cuda, q, k, v, MASKS[mask], deterministic=deterministic)))
            assert_ran(names, "bwd_sm90_kernel", "Hopper backward")
            if deterministic:
                torch.manual_seed(0)
                first = check_backward(cuda, q, k, v, MASKS[mask], deterministic=True)
                torch.manual_seed(0)
                again = check_backward(cuda, q, k, v, MASKS[mask], deterministic=True)
                assert all(torch.equal(x, y) for x, y in zip(first, again)), "bits differ"
    check_varlen_and_seqused(cuda, tally)
    check_attn_mask(cuda, tally)
    check_dropout(cuda, tally)
    # Calls the Hopper backward does not take stay on sm_80 (README's support table).
    q, k, v = (torch.randn(1, 200, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    for name, mask, with_dlse in (("dLSE", "causal", True),
                                  ("ALiBi with a local window", "window_alibi_top_left", False)):
        with tally.case(f"{name} stays on sm_80"):
            names = kernels_run(lambda: check_backward(cuda, q, k, v, MASKS[mask],
                                                       with_dlse=with_dlse))
            assert not any("bwd_sm90" in n for n in names) and any(
                "bwd_dkdv_kernel_16bit" in n for n in names), f"expected the sm_80 backward, ran {names}"


def check_attn_mask(cuda, tally):
    """attn_mask through the Hopper forward and backward (the kAttnMask main loops): a bool
    key-padding mask at d = 64 and a float32 [Sq, Sk] one at d = 128 (test_attn_mask.check_masked:
    out, lse, dq, dk, dv against float64; no mask gradient, which stays on sm_80)."""
    from test_attn_mask import check_masked, make_mask

    for dtype, d, kind, shape, b, sq, sk in ((torch.bfloat16, 64, "bool", (2, 1, 1, 700), 2, 1000, 700),
                                             (torch.float16, 128, "float", (513, 1029), 1, 513, 1029)):
        name = f"attn_mask {kind} {shape} {str(dtype)[6:]} d={d} Sq={sq} Sk={sk}"
        q = torch.randn(b, sq, 4, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(b, sk, 2, d, dtype=dtype, device="cuda") for _ in range(2))
        mask = make_mask(kind, shape, torch.float32, "cuda")
        with tally.case(name):
            names = kernels_run(lambda: check_masked(cuda, q, k, v, mask, scale=d ** -0.5,
                                                     mask_grad=False))
            assert_ran(names, "bwd_sm90_kernel", "Hopper backward")


# Dropout (the kDropout main loops): (dtype, d, causal, B, Sq, Sk, Hq, Hkv). The Hopper backward
# has it at d = 128; at d = 64 and 256 the Hopper forward feeds sm_80's backward, which must draw
# the same keep mask.
DROPOUT_P = 0.17
DROPOUT_CASES = [
    (torch.bfloat16, 128, True, 2, 1000, 1000, 4, 2),
    (torch.float16, 128, False, 1, 129, 2049, 2, 2),
    (torch.bfloat16, 64, True, 1, 513, 257, 4, 1),
    (torch.float16, 256, False, 1, 300, 700, 2, 2),
]


def check_dropout(cuda, tally):
    """out, lse, dq, dk, dv against the float64 reference given the keep mask every executor
    draws for the call's rng_state (torch.ops.flashattn.dropout_keep_mask, on the CPU)."""
    from checks import reference_grads, to64
    from flashattn._reference import attention_reference
    from tolerance import assert_within_torch_error

    for dtype, d, causal, b, sq, sk, hq, hkv in DROPOUT_CASES:
        name = f"dropout {str(dtype)[6:]} d={d} causal={causal} B={b} Sq={sq} Sk={sk} Hq={hq} Hkv={hkv}"
        q = torch.randn(b, sq, hq, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(b, sk, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
        dout = torch.randn_like(q)
        rng_state = torch.ops.flashattn.dropout_rng_state(q)
        keep = torch.ops.flashattn.dropout_keep_mask(rng_state.cpu(), DROPOUT_P, b, hq, sq, sk)
        scale = d ** -0.5
        op = dict(causal=causal, dropout_p=DROPOUT_P, rng_state=rng_state)
        ref_kwargs = dict(causal=causal, softmax_scale=scale, dropout_p=DROPOUT_P,
                          dropout_mask=keep)
        with tally.case(name):
            result = []

            def step():
                out, lse = cuda.fwd(q, k, v, scale, **op)
                result.append((out, lse, cuda.bwd(dout, q, k, v, out, lse, None, scale, **op)))

            names = kernels_run(step)
            assert_ran(names, "fwd_sm90_kernel", "Hopper forward")
            if d == 128:
                assert_ran(names, "bwd_sm90_kernel", "Hopper backward")
            out, lse, grads = result[0]
            qc, kc, vc, dc = (t.cpu() for t in (q, k, v, dout))
            ref_out, ref_lse = attention_reference(to64(qc), to64(kc), to64(vc), **ref_kwargs)
            low_out, low_lse = attention_reference(qc, kc, vc, **ref_kwargs)
            assert_within_torch_error("out", out.cpu(), ref_out, low_out)
            assert_within_torch_error("lse", lse.cpu(), ref_lse, low_lse.float())
            ref = reference_grads(to64(qc), to64(kc), to64(vc), dc.double(), None, ref_kwargs)
            low = reference_grads(qc, kc, vc, dc, None, ref_kwargs)
            for grad, got, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
                assert_within_torch_error(grad, got.cpu(), want, yardstick, factor=3.0)


def check_varlen_and_seqused(cuda, tally):
    """Packed sequences (and a seqused batch) of awkward lengths, Sq != Sk both ways, empty sides,
    causal bottom-right; NaN in every row outside them."""
    from checks import MASKS, check_sequence_backward, mask_arguments

    dtype, d, hq, hkv = torch.bfloat16, 128, 4, 2
    lens_q, lens_k = [1000, 1, 130, 3, 0, 257], [300, 7, 2049, 0, 2, 257]
    cu_q, cu_k = ([0] + torch.tensor(n).cumsum(0).tolist() for n in (lens_q, lens_k))
    q = torch.randn(cu_q[-1] + 5, hq, d, dtype=dtype, device="cuda")
    k, v = (torch.randn(cu_k[-1] + 5, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
    dout = torch.randn_like(q)
    for t, total in ((q, cu_q[-1]), (dout, cu_q[-1]), (k, cu_k[-1]), (v, cu_k[-1])):
        t[total:] = float("nan")
    scale, op_kwargs, ref_kwargs = mask_arguments(MASKS["causal"], q[None])
    i32 = dict(dtype=torch.int32, device="cuda")
    varlen = dict(cu_seqlens_q=torch.tensor(cu_q, **i32), cu_seqlens_k=torch.tensor(cu_k, **i32),
                  max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), **op_kwargs)
    with tally.case("varlen bf16 d=128 causal"):
        grads = []
        names = kernels_run(lambda: grads.append(cuda.bwd(
            dout, q, k, v, *cuda.fwd(q, k, v, scale, **varlen), None, scale, **varlen)))
        assert_ran(names, "bwd_sm90_kernel", "Hopper backward")
        dq, dk, dv = grads[0]
        for b in range(len(lens_q)):
            qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            check_sequence_backward(f"sequence {b}", (dq[qs], dk[ks], dv[ks]), q[qs], k[ks], v[ks],
                                    dout[qs], ref_kwargs)
    # seqused: batch b's first used_q[b] queries and used_k[b] keys; NaN past them.
    used_q, used_k = [1000, 0, 65, 1000], [1000, 300, 1, 7]
    q, dout = (torch.randn(4, 1000, hq, d, dtype=dtype, device="cuda") for _ in range(2))
    k, v = (torch.randn(4, 1000, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
    for b in range(4):
        q[b, used_q[b]:], dout[b, used_q[b]:] = float("nan"), float("nan")
        k[b, used_k[b]:], v[b, used_k[b]:] = float("nan"), float("nan")
    used = dict(seqused_q=torch.tensor(used_q, **i32), seqused_k=torch.tensor(used_k, **i32),
                **op_kwargs)
    with tally.case("seqused bf16 d=128 causal"):
        grads = []
        names = kernels_run(lambda: grads.append(cuda.bwd(
            dout, q, k, v, *cuda.fwd(q, k, v, scale, **used), None, scale, **used)))
        assert_ran(names, "bwd_sm90_kernel", "Hopper backward")
        dq, dk, dv = grads[0]
        for b in range(4):
            nq, nk = used_q[b], used_k[b]
            check_sequence_backward(f"batch {b}", (dq[b, :nq], dk[b, :nk], dv[b, :nk]), q[b, :nq],
                                    k[b, :nk], v[b, :nk], dout[b, :nq], ref_kwargs)


def forward_backward_tflops(causal, d=128, seqlen=4096, tokens=16384, hidden=2048, iters=10):
    b, h = tokens // seqlen, hidden // d
    q, k, v = (torch.randn(b, seqlen, h, d, dtype=torch.bfloat16, device="cuda",
                           requires_grad=True) for _ in range(3))
    dout = torch.randn(b, seqlen, h, d, dtype=torch.bfloat16, device="cuda")

    def step():
        out, _ = torch.ops.flashattn.fwd(q, k, v, causal=causal)
        torch.autograd.grad(out, (q, k, v), dout)

    flop = 3.5 * 4 * b * h * seqlen * seqlen * d / (2 if causal else 1)
    return tflops(step, flop, iters)


BENCHMARKS = [(f"library forward+backward, Hopper kernels, bf16 d=128 N=4096 B*N=16k "
               f"causal={causal}", lambda causal=causal: forward_backward_tflops(causal))
              for causal in (False, True)]


if __name__ == "__main__":
    sys.exit(run_sample(check_cases, BENCHMARKS))
