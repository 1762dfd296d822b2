"""The correctness checks every executor goes through (test_forward.py, test_backward.py,
test_cuda_kernels_sim.py, test_cpu_16bit_products.py): inputs, masks, and the comparison of an
executor's results with the float64 reference, PyTorch's own low-precision error being the
yardstick (tolerance.py)."""
import math

import pytest
import torch

from flashattn._reference import attention_reference
from tolerance import assert_within_torch_error, max_abs_error

# name -> keyword arguments of Executor.fwd/bwd, resolved by mask_arguments(): "alibi" names the
# slopes' shape, "scale" replaces the default softmax scale 1/sqrt(head_dim).
MASKS = {
    "none": {},
    "causal": dict(causal=True),
    "causal_top_left": dict(causal=True, align_bottom_right=False),
    "window": dict(window=(16, 5)),
    "window_left_only": dict(window=(9, -1)),
    "window_right_only": dict(window=(-1, 3)),
    "window_causal": dict(window=(20, -1), causal=True),
    "window_alibi_top_left": dict(window=(6, 2), alibi="heads", align_bottom_right=False),
    "softcap": dict(softcap=2.5),
    "softcap_causal": dict(softcap=2.5, causal=True),
    "alibi": dict(alibi="heads"),
    "alibi_batch_causal": dict(alibi="batch_heads", causal=True),
    "negative_scale": dict(scale=-0.2),
    "all": dict(alibi="heads", softcap=5.0, window=(33, 2), causal=True),
}

# Dtypes only the CPU kernels take; the CUDA kernels (executors "cuda" and "sim") do not.
CPU_ONLY_DTYPES = (torch.float64,)


def supports(executor, dtype):
    """Whether the executor named `executor` ("cpu", "cuda", "sim") takes inputs of `dtype`."""
    return executor == "cpu" or dtype not in CPU_ONLY_DTYPES


def executor_dtype_params(executors, dtypes):
    """Parameters for @pytest.mark.parametrize("executor,dtype", ...): every pair the executor
    supports, and only those, so that no test is generated just to be skipped."""
    return [pytest.param(executor, dtype, id=f"{executor}-{str(dtype).removeprefix('torch.')}")
            for executor in executors for dtype in dtypes if supports(executor, dtype)]


def make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, device):
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    return q, k, v


def seeded_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, seed=0):
    """q [B, Sq, H, D], k and v [B, Sk, Hkv, D] drawn in float32 from a generator of their own
    seeded with `seed`, then cast to dtype: a case's inputs are the same for both of its calls
    (the fp32-result tests, test_out_fp32.py and test_grads_fp32.py, compare a call with and
    without out_fp32 / grads_fp32)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, s, h, head_dim, generator=g).to(dtype)
                 for s, h in ((seqlen_q, heads), (seqlen_k, heads_kv), (seqlen_k, heads_kv)))


def fp32_result_params(cases, sim_cases):
    """(executor, case, dtype) for @pytest.mark.parametrize("executor,case,dtype", ...) of the
    fp32-result tests, and their ids: every case on the CPU, sim_cases on the shim (each GPU
    thread is a fiber there), each in bfloat16 and float16."""
    params = [(ex, name, dtype) for ex in ("cpu", "sim")
              for name in (cases if ex == "cpu" else sim_cases)
              for dtype in (torch.bfloat16, torch.float16)]
    return params, [f"{e}-{c}-{str(d).removeprefix('torch.')}" for e, c, d in params]


def varlen_with_rows_past_the_sequences():
    """A bfloat16 varlen call of the fp32-result tests: 40 rows, sequences [0, 13), [13, 13)
    (empty) and [13, 31), so rows 31-39 belong to no sequence. Returns q, k, v and the op
    arguments."""
    q, k, v = (t[0] for t in seeded_qkv(1, 40, 40, 2, 2, 16, torch.bfloat16, seed=6))
    cu = torch.tensor([0, 13, 13, 31], dtype=torch.int32)
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=18, max_seqlen_k=18, causal=True)
    return q, k, v, kw


def with_dropout_rng_state(kw, seed):
    """A copy of the op arguments kw, with an rng_state of its own for `seed` when it drops."""
    kw = dict(kw)
    if kw.get("dropout_p"):
        kw["rng_state"] = torch.tensor([99 + seed, 4 * seed], dtype=torch.int64)
    return kw


# Where make_qkv_far_below_zero puts the logits (natural-log units, spread +-7 around it): far
# enough below zero that exp (or exp2) of every one underflows to 0 in the type the kernels
# accumulate in (float32, also for 16-bit inputs: below e^-103.3 = 2^-149, the smallest
# denormal; float64: below e^-744.4), so that a running max that starts anywhere but -inf (at 0,
# say) loses every key of the row. Not much further: the LSE is float32 by contract, and its
# rounding (relative 2^-24 of |LSE|) is an error in the P the backward recomputes from it that
# PyTorch's yardstick does not make; at |LSE| ~ 120 it stays inside the tolerance, at ~140 dQ
# with a dLSE term does not (float32). -120 also keeps q.k (before the scale) far inside fp16.
FAR_BELOW_ZERO = {torch.float64: -800.0, torch.float32: -120.0, torch.bfloat16: -120.0,
                  torch.float16: -120.0}


def make_qkv_far_below_zero(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, device):
    """Like make_qkv, but every other query row (0, 2, 4, ...) has every logit
    q_i·k_j/sqrt(head_dim) at FAR_BELOW_ZERO[dtype] plus a spread of a few units (std ~1.5), so
    its softmax is well defined and far from uniform although every exp(logit) underflows; the
    other rows have ordinary logits (std ~1), in the same tiles.

    Feature 0 carries the offset: k[..., 0] = -b for every key, q[..., 0] = a on the far rows
    (a·b/sqrt(head_dim) = -FAR_BELOW_ZERO) and 0 on the others; the remaining features are
    random. Use the default softmax scale 1/sqrt(head_dim)."""
    assert head_dim >= 2, "feature 0 carries the offset, the others the spread"
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, device)
    ab = -FAR_BELOW_ZERO[dtype] * math.sqrt(head_dim)
    a = b = math.sqrt(ab)
    q[:, 0::2] *= 1.5
    q[:, 0::2, :, 0] = a
    q[:, 1::2, :, 0] = 0
    k[..., 0] = -b
    far_logits = torch.einsum("bqhd,bkhd->bhqk", q[:, 0::2].double(),
                              k.double().repeat_interleave(heads // heads_kv, dim=2))
    accumulated = torch.float64 if dtype == torch.float64 else torch.float32
    assert torch.all((far_logits / math.sqrt(head_dim)).to(accumulated).exp() == 0)
    return q, k, v


def make_alibi(kind, batch, heads, device):
    if kind is None:
        return None
    shape = (heads,) if kind == "heads" else (batch, heads)
    return (torch.rand(shape, device=device) * 0.5 + 0.01).float()


def mask_arguments(mask, q, scale=None):
    """A MASKS entry for inputs shaped like q -> (softmax scale, keyword arguments of
    Executor.fwd/bwd, keyword arguments of attention_reference). Draws the alibi slopes, so
    the executor and the reference see the same ones. scale, if given, wins over the mask's."""
    mask = dict(mask)
    alibi = make_alibi(mask.pop("alibi", None), q.shape[0], q.shape[2], q.device)
    window = mask.pop("window", (-1, -1))
    mask_scale = mask.pop("scale", 1.0 / math.sqrt(q.shape[-1]))
    scale = mask_scale if scale is None else scale
    # What is left (causal, softcap, align_bottom_right) has the same name in both.
    op_kwargs = dict(window=window, alibi_slopes=alibi, **mask)
    ref_kwargs = dict(softmax_scale=scale, window_size=window,
                      alibi_slopes=None if alibi is None else alibi.cpu(), **mask)
    return scale, op_kwargs, ref_kwargs


def to64(t):
    return t.detach().cpu().double()


def check_forward(ex, q, k, v, mask, scale=None):
    """Runs executor ex and compares out and lse with the float64 reference."""
    scale, op_kwargs, ref_kwargs = mask_arguments(mask, q, scale)
    out, lse = ex.fwd(q, k, v, scale, **op_kwargs)
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    low_out, low_lse = attention_reference(q.cpu(), k.cpu(), v.cpu(), **ref_kwargs)
    assert out.shape == (*q.shape[:-1], v.shape[-1]) and out.dtype == q.dtype
    assert lse.dtype == torch.float32
    assert_within_torch_error("out", out.cpu(), ref_out, low_out)
    assert_within_torch_error("lse", lse.cpu(), ref_lse, low_lse.float())
    return out, lse


# (input that gets the NaN, mask). A NaN in v is checked without a mask: behind one, which rows
# it reaches depends on tiling (0 · NaN is NaN inside a tile, a skipped tile multiplies nothing).
NAN_CASES = [("q", "none"), ("q", "causal"), ("k", "none"), ("k", "causal"),
             ("k", "window_causal"), ("v", "none")]


def check_nan_propagation(ex, q, k, v, where, mask):
    """Puts a NaN into one element of q, k or v (in the middle of the sequence) and checks that
    exactly the outputs and LSEs whose softmax sees it are NaN, as in the float64 reference and
    F.scaled_dot_product_attention: never dropped, never spread further."""
    x = {"q": q, "k": k, "v": v}[where]
    x[0, x.shape[1] // 2, x.shape[2] - 1, min(5, x.shape[3] - 1)] = float("nan")
    scale, op_kwargs, ref_kwargs = mask_arguments(MASKS[mask], q)
    out, lse = ex.fwd(q, k, v, scale, **op_kwargs)
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    assert ref_out.isnan().any()
    assert torch.equal(out.isnan().cpu(), ref_out.isnan())
    assert torch.equal(lse.isnan().cpu(), ref_lse.isnan())


def reference_grads(q, k, v, dout, dlse, ref_kwargs):
    """Gradients of <out, dout> + <lse, dlse> through the reference, in q's dtype."""
    leaves = [t.detach().cpu().clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention_reference(*leaves, **ref_kwargs)
    loss = (out * dout.cpu().to(out.dtype)).sum()
    if dlse is not None:
        loss = loss + (torch.where(torch.isfinite(lse), lse, 0) * dlse.cpu().to(lse.dtype)).sum()
    loss.backward()
    return [t.grad for t in leaves]


def check_backward(ex, q, k, v, mask, with_dlse=False, deterministic=False):
    """Runs executor ex forward and backward with a random dout (and dlse) and compares dq, dk,
    dv with float64 autograd through the reference."""
    scale, op_kwargs, ref_kwargs = mask_arguments(mask, q)
    out, lse = ex.fwd(q, k, v, scale, **op_kwargs)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_dlse else None
    dq, dk, dv = ex.bwd(dout, q, k, v, out, lse, dlse, scale, deterministic=deterministic,
                        **op_kwargs)
    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(),
                          None if dlse is None else dlse.double(), ref_kwargs)
    low = reference_grads(q, k, v, dout, dlse, ref_kwargs)
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        assert got.dtype == q.dtype
        assert_within_torch_error(name, got.cpu(), want, yardstick, factor=3.0,
                                  slack=rounding_slack(want, yardstick))
    return dq, dk, dv


def largest_element_ulp(want, dtype):
    """One ulp of dtype at the largest element of the reference `want` (eps times it: at least
    the spacing of dtype there)."""
    return torch.finfo(dtype).eps * want.abs().max().item() if want.numel() else 0.0


def rounding_slack(want, torch_lowp):
    """Half of largest_element_ulp where PyTorch's own error is below that ulp, else 0. A kernel
    that computes in fp32 and rounds once to the output's dtype is off by its fp32 error plus up
    to half an ulp: this slack lets the rule hold the fp32 error to 3x PyTorch's. It is needed
    where PyTorch's worst error is little more than its own final rounding (within an ulp), a
    sample that can land at a fraction of an ulp by luck where few elements reach the largest
    magnitude (dK at head_dim 1: a handful of keys near |10|, where a bf16 ulp is 0.0625), so
    that 3x it leaves no room for the kernel's rounding; where PyTorch is off by more than an
    ulp, 3x its error covers the rounding and nothing is added."""
    ulp = largest_element_ulp(want, torch_lowp.dtype)
    return ulp / 2 if max_abs_error(torch_lowp, want) < ulp else 0.0


def check_sequence_backward(name, grads, q, k, v, dout, ref_kwargs, output_ulp=False):
    """dq, dk, dv (grads) of one sequence of a varlen or seqused call (q, dout [Sq, Hq, D], k, v
    [Sk, Hkv, D]) against float64 autograd through the reference, within 3x PyTorch's own error;
    with no key dq is 0, with no query dk and dv are. output_ulp: plus one ulp of each gradient's
    largest reference element, for gradients carried by a few elements (a one-query sequence),
    where PyTorch's own final rounding may land within a fraction of an ulp by luck."""
    grads = [g.cpu() for g in grads]
    q, k, v, dout = (t.cpu() for t in (q, k, v, dout))
    for grad_name, grad in zip(("dq", "dk", "dv"), grads):
        assert grad.isfinite().all(), f"{grad_name} {name}: not finite"
    if k.shape[0] == 0 or q.shape[0] == 0:
        assert all((g == 0).all() for g in grads), f"{name}: an empty side, gradients not 0"
        return
    ref = reference_grads(to64(q[None]), to64(k[None]), to64(v[None]), dout[None].double(), None,
                          ref_kwargs)
    low = reference_grads(q[None], k[None], v[None], dout[None], None, ref_kwargs)
    for grad_name, grad, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
        slack = largest_element_ulp(want, grad.dtype) if output_ulp else 0.0
        assert_within_torch_error(f"{grad_name} {name}", grad[None], want, yardstick, factor=3.0,
                                  slack=slack)


def assert_bitwise_deterministic(ex, dtype, mask):
    """deterministic=True gives the same bits on every call, whatever the thread count."""
    q, k, v = make_qkv(2, 300, 280, 4, 2, 64, dtype, ex.device)
    scale = 0.125
    kwargs = dict(window=(100, 3), causal=True, softcap=3.0) if mask == "all" else {}
    out, lse = ex.fwd(q, k, v, scale, **kwargs)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (threads, 1, threads):
            torch.set_num_threads(n)
            results.append(ex.bwd(dout, q, k, v, out, lse, dlse, scale, deterministic=True,
                                  **kwargs))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
