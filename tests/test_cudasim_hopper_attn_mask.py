"""attn_mask on the sm_90a forward and backward as the library runs them (torch.ops.flashattn_sim on
a device the shim presents as compute capability 9.0 with FLASHATTN_CUDA_HOPPER=1): the kAttnMask
main loops, bool and additive masks (fp32 and the inputs' 16-bit type) in the broadcast shapes
the op accepts, alone, causal (both alignments) and with a local window, with softcap, ALiBi or
both (run-time choices inside those loops; the backward's softcap in loops of its own, at d = 64
only), GQA, seqused, awkward lengths and Sq != Sk both ways. Outputs are poisoned before the kernels write them (conftest.py);
results are compared with the float64 reference within 2x PyTorch's own error (3x for
gradients), and with the sm_80 kernels on the same call. The shim's counters show which kernel
ran.

Every case runs under the forward, reverse and a random warp schedule, each with lazy, eager or
random completion of the TMA copies (as test_cudasim_hopper_call_path.py).
"""

import pytest
import torch

from checks import to64
from flashattn._reference import attention_reference
from hopper_sim import ELEMENTS, launched, schedule_fixture
from tolerance import assert_within_torch_error

schedule = schedule_fixture()


# Broadcast shapes of the mask ("B", "H", "S" = Sq, "K" = Sk): the op's view gives the kernels
# stride 0 along the broadcast dimensions.
SHAPES = {
    "full": ("B", "H", "S", "K"),
    "2d": ("S", "K"),
    "key_padding": ("B", 1, 1, "K"),
    "per_query": ("B", 1, "S", 1),
    "per_head": (1, "H", "S", "K"),
}


def make_mask(kind, shape_name, b, hq, sq, sk, dtype):
    """A bool mask (True = take part), or an additive one of `kind` ("float32" or "16bit", the
    inputs' dtype): random values, -inf where hidden. About a third hidden, plus one row hidden
    entirely where the shape has rows (out 0, lse -inf there unless a window also hides it)."""
    sizes = {"B": b, "H": hq, "S": sq, "K": sk}
    shape = tuple(sizes.get(x, x) for x in SHAPES[shape_name])
    keep = torch.rand(shape) >= 0.3
    if "S" in SHAPES[shape_name] and sq > 2:
        keep[..., sq // 2, :] = False
    if kind == "bool":
        return keep
    values = torch.randn(shape, dtype=torch.float32 if kind == "float32" else dtype)
    return values.masked_fill(~keep, float("-inf"))


def mask_kwargs(spec):
    """A case's visibility rules -> (op keyword arguments, reference keyword arguments)."""
    window = spec.get("window", (-1, -1))
    causal = spec.get("causal", False)
    align = spec.get("align_bottom_right", True)
    op = dict(window=window, causal=causal, align_bottom_right=align)
    ref = dict(window_size=window, causal=causal, align_bottom_right=align)
    return op, ref


def sm90_kernel(dtype, d, spec):
    """The kAttnMask kernel a call runs: fwd_sm90_kernel<Elem, d, kCausal, kSoftcap, kLocal,
    kAlibi, kAttnMask, kGatherKv> (plan_fwd_sm90.h sm90_fwd_mask: causal is the window's right edge at 0)."""
    left, right = spec.get("window", (-1, -1))
    if spec.get("causal"):
        right = 0
    causal = left < 0 and right == 0
    local = not causal and (left >= 0 or right >= 0)
    return (f"fwd_sm90_kernel<{ELEMENTS[dtype]}, {d}, {str(causal).lower()}, false, "
            f"{str(local).lower()}, false, true, false, false>")


def reference(q, k, v, mask, scale, ref_kwargs):
    """(float64 out, lse) and PyTorch's own in q's dtype (the mask rounded to it, as PyTorch's
    16-bit attention would hold an additive mask)."""
    mask64 = mask if mask.dtype == torch.bool else to64(mask)
    ref = attention_reference(to64(q), to64(k), to64(v), attn_mask=mask64, softmax_scale=scale,
                              **ref_kwargs)
    low_mask = mask if mask.dtype == torch.bool else mask.to(q.dtype)
    low = attention_reference(q, k, v, attn_mask=low_mask, softmax_scale=scale, **ref_kwargs)
    return ref, low


VIS = {
    "none": {},
    "causal": dict(causal=True),
    "causal_top_left": dict(causal=True, align_bottom_right=False),
    "window": dict(window=(16, 5)),
    "window_left_only": dict(window=(9, -1)),
}

# (dtype, head dim, mask kind, mask shape, visibility, B, Sq, Sk, Hq, Hkv): every kind and shape,
# both dtypes, d = 64, 128 and 256 (64-key tiles, the loops with lean S descriptors:
# fwd_sm90_kernel.cuh kLeanDescriptors), causal in both alignments and local windows combined with
# the mask, GQA, Sq != Sk both ways, lengths 1, 7, 63, 65, 127, 129, 257.
FWD_CASES = [
    (torch.bfloat16, 64, "bool", "full", "none", 2, 65, 129, 2, 1),
    (torch.float16, 128, "float32", "2d", "causal", 1, 129, 63, 2, 2),
    (torch.bfloat16, 64, "16bit", "key_padding", "causal_top_left", 2, 257, 65, 3, 1),
    (torch.float16, 64, "16bit", "per_query", "none", 2, 7, 257, 1, 1),
    (torch.bfloat16, 128, "bool", "per_head", "window", 1, 127, 129, 2, 1),
    (torch.float16, 64, "float32", "full", "window_left_only", 1, 63, 127, 1, 1),
    (torch.bfloat16, 128, "float32", "key_padding", "causal", 1, 65, 129, 2, 1),
    (torch.float16, 128, "bool", "2d", "none", 1, 1, 1, 1, 1),
    (torch.bfloat16, 256, "bool", "full", "none", 2, 65, 129, 2, 1),
    (torch.float16, 256, "float32", "2d", "causal", 1, 129, 63, 2, 2),
    (torch.bfloat16, 256, "16bit", "key_padding", "causal_top_left", 1, 257, 65, 2, 1),
    (torch.float16, 256, "bool", "per_head", "window", 1, 127, 129, 2, 1),
    (torch.bfloat16, 256, "float32", "per_query", "window_left_only", 1, 7, 257, 1, 1),
    (torch.float16, 256, "16bit", "full", "none", 1, 1, 1, 1, 1),
]


@pytest.mark.parametrize("dtype, d, kind, shape, vis, b, sq, sk, hq, hkv", FWD_CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_forward_with_attn_mask(schedule, hopper, dtype, d, kind, shape, vis, b, sq, sk,
                                       hq, hkv):
    check_forward(hopper, dtype, d, kind, shape, vis, b, sq, sk, hq, hkv, extra={})


def check_forward(hopper, dtype, d, kind, shape, vis, b, sq, sk, hq, hkv, extra):
    """One sm_90a forward with the mask (and `extra` logit arguments: softcap, ALiBi) against the
    float64 reference, within twice torch's own error in dtype."""
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, dtype=dtype) for _ in range(2))
    mask = make_mask(kind, shape, b, hq, sq, sk, dtype)
    scale = d ** -0.5
    op_kwargs, ref_kwargs = mask_kwargs(VIS[vis])
    (out, lse), counters = hopper.counted(
        lambda: hopper.fwd(q, k, v, scale, attn_mask=mask, **op_kwargs, **extra))
    kernels = launched(counters)
    assert len(kernels) == 1 and sm90_kernel(dtype, d, VIS[vis]) in kernels[0], kernels
    (ref_out, ref_lse), (low_out, low_lse) = reference(q, k, v, mask, scale, dict(ref_kwargs, **extra))
    assert_within_torch_error("out", out, ref_out, low_out)
    assert_within_torch_error("lse", lse, ref_lse, low_lse.float())
    # Rows the mask hides entirely: out 0, lse -inf (a row of the kernel's own that saw no key).
    hidden = ~torch.isfinite(ref_lse)
    assert (lse[hidden] == float("-inf")).all()
    assert (out.transpose(1, 2)[hidden] == 0).all()


def run_sm80(hopper, fn):
    """fn() with the device as an H100 without the opt-in: the sm_80 kernels take the call."""
    hopper.ops.set_device(9, 0, False)
    try:
        result, counters = hopper.counted(fn)
    finally:
        hopper.ops.set_device(9, 0, True)
    assert launched(counters) and all("sm90" not in k for k in launched(counters))
    return result


@pytest.mark.parametrize("kind", ["bool", "float32", "16bit"])
def test_hopper_forward_mask_matches_sm80(hopper, kind):
    # The same masked call on both kernels: one key tile on each (Sk = 64 <= both tiles) and
    # query rows in one tile, so the products that differ are the MMAs' shapes only. Both must
    # meet the float64 reference, and they must agree with each other within PyTorch's error
    # too (their scores, mask bias and softmax are the same fp32 steps, score_rules.cuh).
    q = torch.randn(1, 50, 2, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 64, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    mask = make_mask(kind, "full", 1, 2, 50, 64, torch.bfloat16)
    call = lambda: hopper.fwd(q, k, v, 0.125, attn_mask=mask, causal=True)
    (out, lse), counters = hopper.counted(call)
    assert "fwd_sm90_kernel<" in launched(counters)[0]
    out80, lse80 = run_sm80(hopper, call)
    (ref_out, ref_lse), (low_out, low_lse) = reference(q, k, v, mask, 0.125, dict(causal=True))
    for name, got in (("sm90", out), ("sm80", out80)):
        assert_within_torch_error(f"out {name}", got, ref_out, low_out)
    assert torch.equal(lse.isfinite(), lse80.isfinite())
    finite = lse.isfinite()
    # The LSE is the softmax's fp32 sum of the same exp2 of the same logits, in another order.
    assert torch.allclose(lse[finite], lse80[finite], rtol=0, atol=2e-6)


def test_hopper_forward_mask_seqused(hopper):
    # seqused_q / seqused_k with a mask shaped by the full lengths: rows and keys past a batch's
    # used ones are not read (their mask entries are NaN here: any read would show).
    used_q = torch.tensor([65, 30], dtype=torch.int32)
    used_k = torch.tensor([100, 129], dtype=torch.int32)
    q = torch.randn(2, 65, 2, 64, dtype=torch.float16)
    k, v = (torch.randn(2, 129, 2, 64, dtype=torch.float16) for _ in range(2))
    mask = make_mask("float32", "full", 2, 2, 65, 129, torch.float16)
    for b, (nq, nk) in enumerate(zip(used_q.tolist(), used_k.tolist())):
        mask[b, :, nq:] = float("nan")
        mask[b, :, :, nk:] = float("nan")
    (out, lse), counters = hopper.counted(lambda: hopper.fwd(
        q, k, v, 0.125, attn_mask=mask, seqused_q=used_q, seqused_k=used_k, causal=True))
    assert "fwd_sm90_kernel<" in launched(counters)[0]
    for b, (nq, nk) in enumerate(zip(used_q.tolist(), used_k.tolist())):
        qb, kb, vb, mb = q[b:b + 1, :nq], k[b:b + 1, :nk], v[b:b + 1, :nk], mask[b:b + 1, :, :nq, :nk]
        (ref_out, ref_lse), (low_out, low_lse) = reference(qb, kb, vb, mb, 0.125, dict(causal=True))
        assert_within_torch_error(f"out[{b}]", out[b:b + 1, :nq], ref_out, low_out)
        assert_within_torch_error(f"lse[{b}]", lse[b:b + 1, :, :nq], ref_lse, low_lse.float())


def logit_arguments(logits, b, hq):
    """A case's softcap and ALiBi ("none", "softcap", "alibi_h", "alibi_bh", "softcap_alibi_bh")
    -> keyword arguments for the op and the reference alike: fresh slopes, [Hq] or [B, Hq]."""
    kwargs = {}
    if "softcap" in logits:
        kwargs["softcap"] = 2.5
    if "alibi_bh" in logits:
        kwargs["alibi_slopes"] = torch.rand(b, hq) * 0.5 + 0.01
    elif "alibi_h" in logits:
        kwargs["alibi_slopes"] = torch.rand(hq) * 0.5 + 0.01
    return kwargs


# (dtype, head dim, mask kind, mask shape, visibility, softcap / ALiBi, B, Sq, Sk, Hq, Hkv):
# attn_mask with softcap, with ALiBi ([Hq] and [B, Hq] slopes) and with both, inside the kAttnMask
# loops at run time (launch_fwd_sm90.cuh), in the order scale, softcap, ALiBi, mask, visibility.
FWD_LOGIT_CASES = [
    (torch.bfloat16, 64, "bool", "full", "none", "softcap", 2, 65, 129, 2, 1),
    (torch.float16, 128, "float32", "2d", "causal", "alibi_h", 1, 129, 63, 2, 2),
    (torch.bfloat16, 128, "16bit", "key_padding", "causal_top_left", "alibi_bh", 2, 257, 65, 3, 1),
    (torch.float16, 64, "16bit", "per_query", "window", "softcap_alibi_bh", 2, 7, 257, 2, 1),
    (torch.bfloat16, 64, "float32", "per_head", "window_left_only", "softcap_alibi_h", 1, 127, 129, 2, 1),
    (torch.float16, 128, "bool", "full", "none", "softcap_alibi_h", 1, 1, 1, 1, 1),
    # d = 256: softcap with a window too, which softcap's own loop does not take there.
    (torch.float16, 256, "bool", "full", "window", "softcap", 1, 65, 129, 2, 1),
    (torch.bfloat16, 256, "float32", "key_padding", "causal", "softcap_alibi_bh", 2, 129, 63, 2, 1),
    (torch.float16, 256, "16bit", "2d", "causal_top_left", "alibi_h", 1, 63, 127, 2, 2),
    (torch.bfloat16, 256, "16bit", "per_query", "window_left_only", "softcap_alibi_h", 1, 257, 65, 1, 1),
]


@pytest.mark.parametrize("dtype, d, kind, shape, vis, logits, b, sq, sk, hq, hkv", FWD_LOGIT_CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_forward_mask_with_softcap_and_alibi(schedule, hopper, dtype, d, kind, shape, vis, logits,
                                                    b, sq, sk, hq, hkv):
    check_forward(hopper, dtype, d, kind, shape, vis, b, sq, sk, hq, hkv, extra=logit_arguments(logits, b, hq))


# ---- the backward ----

def reference_grads(q, k, v, mask, dout, scale, ref_kwargs):
    """dq, dk, dv of the reference through autograd, in q's dtype (float64 inputs: exact)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, _ = attention_reference(*leaves, attn_mask=mask, softmax_scale=scale, **ref_kwargs)
    return torch.autograd.grad(out, leaves, dout.to(out.dtype))


def sm90_bwd_kernel(dtype, d, spec, softcap=False):
    """bwd_sm90_kernel<Elem, d, kCausal, kLocal, kAlibi, kSoftcap, kAttnMask, kDropout> of a call."""
    left, right = spec.get("window", (-1, -1))
    if spec.get("causal"):
        right = 0
    causal = left < 0 and right == 0
    local = not causal and (left >= 0 or right >= 0)
    return (f"bwd_sm90_kernel<{ELEMENTS[dtype]}, {d}, {str(causal).lower()}, "
            f"{str(local).lower()}, false, {str(softcap).lower()}, true, false>")


# (dtype, head dim, mask kind, mask shape, visibility, deterministic, B, Sq, Sk, Hq, Hkv): both
# head dims (the d = 64 loop's 128-query blocks, d = 128's 64), every kind, broadcast shapes,
# causal both ways and windows with the mask, GQA (dK, dV summed over a group whose heads see
# different masks), Sq != Sk both ways, awkward lengths.
BWD_CASES = [
    (torch.bfloat16, 64, "bool", "full", "none", False, 2, 65, 129, 2, 1),
    (torch.float16, 128, "float32", "2d", "causal", True, 1, 129, 63, 2, 2),
    (torch.bfloat16, 128, "16bit", "per_head", "causal_top_left", False, 1, 257, 65, 4, 2),
    (torch.float16, 64, "16bit", "key_padding", "window", False, 2, 7, 257, 1, 1),
    (torch.bfloat16, 64, "float32", "per_query", "window_left_only", True, 1, 127, 129, 2, 1),
    (torch.float16, 128, "bool", "full", "none", False, 1, 1, 1, 1, 1),
]


@pytest.mark.parametrize("dtype, d, kind, shape, vis, deterministic, b, sq, sk, hq, hkv", BWD_CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_backward_with_attn_mask(schedule, hopper, dtype, d, kind, shape, vis, deterministic,
                                        b, sq, sk, hq, hkv):
    check_backward(hopper, dtype, d, kind, shape, vis, b, sq, sk, hq, hkv, deterministic, extra={})


def check_backward(hopper, dtype, d, kind, shape, vis, b, sq, sk, hq, hkv, deterministic, extra):
    """One sm_90a backward with the mask (and `extra` logit arguments) against the float64
    reference's gradients, within three times torch's own error in dtype."""
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, dtype=dtype) for _ in range(2))
    mask = make_mask(kind, shape, b, hq, sq, sk, dtype)
    scale = d ** -0.5
    op_kwargs, ref_kwargs = mask_kwargs(VIS[vis])
    out, lse = hopper.fwd(q, k, v, scale, attn_mask=mask, **op_kwargs, **extra)
    dout = torch.randn_like(out)
    grads, counters = hopper.counted(lambda: hopper.bwd(
        dout, q, k, v, out, lse, None, scale, attn_mask=mask, deterministic=deterministic,
        **op_kwargs, **extra))
    kernels = launched(counters)
    assert len(kernels) == 3 and sm90_bwd_kernel(dtype, d, VIS[vis], "softcap" in extra) in kernels[1], kernels
    mask64 = mask if mask.dtype == torch.bool else to64(mask)
    low_mask = mask if mask.dtype == torch.bool else mask.to(dtype)
    ref_kwargs = dict(ref_kwargs, **extra)
    ref = reference_grads(to64(q), to64(k), to64(v), mask64, dout.double(), scale, ref_kwargs)
    low = reference_grads(q, k, v, low_mask, dout, scale, ref_kwargs)
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
        assert got.isfinite().all(), name
        assert_within_torch_error(name, got, want, yardstick, factor=3.0)


# (dtype, head dim, mask kind, mask shape, visibility, ALiBi, B, Sq, Sk, Hq, Hkv): the kAttnMask
# loops with ALiBi at run time (launch_bwd_sm90.cuh), [Hq] and [B, Hq] slopes; both head dims,
# causal both ways and windows, GQA, awkward lengths, Sq != Sk both ways.
BWD_LOGIT_CASES = [
    (torch.bfloat16, 64, "float32", "full", "none", "alibi_h", 2, 65, 129, 2, 1),
    (torch.float16, 128, "bool", "2d", "causal", "alibi_bh", 1, 129, 63, 2, 2),
    (torch.bfloat16, 128, "16bit", "per_head", "causal_top_left", "alibi_h", 1, 257, 65, 4, 2),
    (torch.float16, 64, "bool", "key_padding", "window", "alibi_bh", 2, 7, 257, 2, 1),
    (torch.bfloat16, 64, "16bit", "per_query", "window_left_only", "alibi_h", 1, 127, 129, 2, 1),
    (torch.float16, 128, "float32", "full", "none", "alibi_bh", 1, 1, 1, 1, 1),
]


@pytest.mark.parametrize("dtype, d, kind, shape, vis, logits, b, sq, sk, hq, hkv", BWD_LOGIT_CASES,
                         ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_backward_mask_with_alibi(schedule, hopper, dtype, d, kind, shape, vis, logits,
                                         b, sq, sk, hq, hkv):
    check_backward(hopper, dtype, d, kind, shape, vis, b, sq, sk, hq, hkv, deterministic=False,
                   extra=logit_arguments(logits, b, hq))


# (dtype, head dim, mask kind, mask shape, visibility, softcap / ALiBi, deterministic, B, Sq, Sk,
# Hq, Hkv): the kAttnMask + kSoftcap loops (softcap's chain factor parked in shared memory across
# dP^T's wait, bwd_sm90_kernel.cuh; at d = 128 compiled apart, run_bwd_sm90_mask_softcap), alone
# and with ALiBi at run time ([Hq] and [B, Hq] slopes); every mask kind, causal both ways and
# windows, GQA, awkward lengths, Sq != Sk both ways; both head dims and dtypes.
BWD_SOFTCAP_CASES = [
    (torch.bfloat16, 64, "float32", "full", "none", "softcap", False, 2, 65, 129, 2, 1),
    (torch.float16, 64, "bool", "2d", "causal", "softcap_alibi_bh", True, 1, 129, 63, 2, 2),
    (torch.bfloat16, 64, "16bit", "per_head", "causal_top_left", "softcap", False, 1, 257, 65, 4, 2),
    (torch.float16, 64, "16bit", "key_padding", "window", "softcap_alibi_h", False, 2, 7, 257, 2, 1),
    (torch.bfloat16, 64, "bool", "per_query", "window_left_only", "softcap_alibi_bh", True, 1, 127, 129, 2, 1),
    (torch.float16, 64, "float32", "2d", "causal", "softcap", False, 1, 129, 257, 3, 1),
    (torch.float16, 64, "float32", "full", "window", "softcap", False, 1, 63, 127, 1, 1),
    (torch.bfloat16, 64, "bool", "full", "none", "softcap_alibi_h", False, 1, 1, 1, 1, 1),
    (torch.float16, 128, "float32", "full", "none", "softcap", False, 1, 65, 129, 2, 2),
    (torch.bfloat16, 128, "bool", "2d", "causal", "softcap_alibi_bh", True, 2, 129, 63, 2, 1),
    (torch.float16, 128, "16bit", "per_head", "causal_top_left", "softcap_alibi_h", False, 1, 257, 65, 4, 2),
    (torch.bfloat16, 128, "16bit", "key_padding", "window", "softcap", False, 2, 7, 257, 2, 1),
    (torch.float16, 128, "bool", "per_query", "window_left_only", "softcap_alibi_bh", True, 1, 127, 129, 1, 1),
]


@pytest.mark.parametrize("dtype, d, kind, shape, vis, logits, deterministic, b, sq, sk, hq, hkv",
                         BWD_SOFTCAP_CASES, ids=lambda x: str(x).replace("torch.", ""))
def test_hopper_backward_mask_with_softcap(schedule, hopper, dtype, d, kind, shape, vis, logits,
                                           deterministic, b, sq, sk, hq, hkv):
    check_backward(hopper, dtype, d, kind, shape, vis, b, sq, sk, hq, hkv, deterministic,
                   extra=logit_arguments(logits, b, hq))


@pytest.mark.parametrize("stall", ["1", "2"])
@pytest.mark.parametrize("case", [0, 4], ids=["none", "window"])
def test_hopper_backward_mask_with_softcap_consumer_held_back(hopper, monkeypatch, case, stall):
    # The parked factors sit in this consumer's half of the dS^T buffer that the other consumer's
    # dQ MMA read two query blocks earlier: with one consumer held back (CUDASIM_STALL_WARPGROUP)
    # the other runs ahead as far as the ds_ready barrier lets it, under the random schedule.
    dtype, d, kind, shape, vis, logits, deterministic, b, sq, sk, hq, hkv = BWD_SOFTCAP_CASES[case]
    monkeypatch.setenv("CUDASIM_STALL_WARPGROUP", stall)
    hopper.set_schedule("random:3")
    hopper.ops.set_copy_completion("random")
    try:
        check_backward(hopper, dtype, d, kind, shape, vis, b, sq, sk, hq, hkv, deterministic,
                       extra=logit_arguments(logits, b, hq))
    finally:
        hopper.set_schedule("forward")
        hopper.ops.set_copy_completion("")


def test_hopper_backward_mask_gradient_runs_sm80(hopper):
    # attn_mask_grad (a float mask that requires grad): dL/dlogit is written by sm_80's kernels
    # only, so the plan keeps that backward there; the gradients are right.
    q = torch.randn(1, 65, 2, 64, dtype=torch.float16)
    k, v = (torch.randn(1, 129, 2, 64, dtype=torch.float16) for _ in range(2))
    mask = make_mask("float32", "full", 1, 2, 65, 129, torch.float16)
    out, lse = hopper.fwd(q, k, v, 0.125, attn_mask=mask)
    dout = torch.randn_like(out)
    grads, counters = hopper.counted(lambda: hopper.bwd(
        dout, q, k, v, out, lse, None, 0.125, attn_mask=mask, attn_mask_grad=True))
    assert not any("sm90" in k for k in launched(counters)), launched(counters)
    ref = reference_grads(to64(q), to64(k), to64(v), to64(mask), dout.double(), 0.125, {})
    low = reference_grads(q, k, v, mask.to(q.dtype), dout, 0.125, {})
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), grads[:3], ref, low):
        assert_within_torch_error(name, got, want, yardstick, factor=3.0)
