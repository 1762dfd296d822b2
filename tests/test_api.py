"""The public API: FA2's and SDPA's signatures and semantics, and clear errors for bad input."""
import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import flashattn
from flashattn._reference import attention_reference
from checks import make_qkv
from tolerance import assert_within_torch_error


def test_flash_attn_func_signature_matches_fa2():
    params = inspect.signature(flashattn.flash_attn_func).parameters
    expected = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)
    positional = [n for n, p in params.items() if p.kind != p.KEYWORD_ONLY]
    assert positional == ["q", "k", "v", *expected]
    assert {name: params[name].default for name in expected} == expected
    # FA3's FP8 descales, keyword only after FA2's arguments (tests/test_fp8_args.py).
    keyword_only = [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY]
    assert keyword_only == ["q_descale", "k_descale", "v_descale"]


def test_sdpa_signature_matches_torch():
    ours = inspect.signature(flashattn.scaled_dot_product_attention).parameters
    expected = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
    assert list(ours) == ["query", "key", "value", *expected]
    assert {name: ours[name].default for name in expected} == expected


def test_return_attn_probs_gives_lse():
    q, k, v = make_qkv(2, 33, 40, 4, 2, 16, torch.float32, "cpu")
    out, lse, dropout_mask = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    ref_out, ref_lse = attention_reference(q.double(), k.double(), v.double(), causal=True)
    assert dropout_mask is None and lse.dtype == torch.float32 and lse.shape == (2, 4, 33)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.double(), ref_out, rtol=0, atol=1e-5)
    assert torch.equal(flashattn.flash_attn_func(q, k, v, causal=True), out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("seqlens", [(64, 64), (17, 130), (130, 17)], ids=str)
def test_sdpa_matches_torch_sdpa(dtype, is_causal, seqlens):
    """Same call, same numbers as F.scaled_dot_product_attention (top-left causal)."""
    seqlen_q, seqlen_k = seqlens
    q = torch.randn(2, 4, seqlen_q, 48, dtype=dtype)
    k = torch.randn(2, 2, seqlen_k, 48, dtype=dtype)
    v = torch.randn(2, 2, seqlen_k, 48, dtype=dtype)
    ours = flashattn.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.3,
                                                  enable_gqa=True)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.3,
                                            enable_gqa=True)
    ref, _ = attention_reference(*(t.transpose(1, 2).double() for t in (q, k, v)),
                                 softmax_scale=0.3, causal=is_causal, align_bottom_right=False)
    assert ours.shape == theirs.shape
    assert_within_torch_error("sdpa out", ours, ref.transpose(1, 2), theirs)


# Ops that make views, never copies: what may run between a front end and the kernel (detach:
# autograd saving its inputs).
VIEW_OPS = {"aten.unbind.int", "aten.transpose.int", "aten.detach.default"}


def _record_ops(fn):
    from torch.utils._python_dispatch import TorchDispatchMode

    class RecordOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with RecordOps() as rec:
        result = fn()
    return result, rec.ops


def test_sdpa_passes_views_without_copying():
    """No copy, contiguous() or clone between the SDPA front end and the kernel."""
    q, k, v = (torch.randn(2, 3, 50, 32) for _ in range(3))
    _, ops = _record_ops(lambda: flashattn.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert "flashattn.fwd.default" in ops
    assert set(ops) <= VIEW_OPS | {"flashattn.fwd.default"}, ops


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = make_qkv(1, 20, 20, 2, 2, 25, torch.float32, "cpu")
    torch.testing.assert_close(flashattn.flash_attn_func(q, k, v),
                               flashattn.flash_attn_func(q, k, v, softmax_scale=1 / math.sqrt(25)))


# ----------------------------------------------------------------------------------------------
# Bad input: a clear error naming the argument, expected vs given.

def qkv(**overrides):
    base = dict(q=torch.randn(2, 10, 4, 16), k=torch.randn(2, 12, 2, 16),
                v=torch.randn(2, 12, 2, 16))
    base.update(overrides)
    return base


BAD_INPUTS = {
    "rank": (qkv(q=torch.randn(10, 4, 16)), r"q must be a 4-D tensor.*got 3-D"),
    "batch": (qkv(k=torch.randn(3, 12, 2, 16), v=torch.randn(3, 12, 2, 16)),
              r"same batch size, got 2, 3 and 3"),
    "head_dim": (qkv(k=torch.randn(2, 12, 2, 8)),
                 r"q and k must have the same head dim, got 16 and 8"),
    "kv_heads": (qkv(v=torch.randn(2, 12, 1, 16)), r"k and v must have the same number of heads"),
    "kv_seqlen": (qkv(v=torch.randn(2, 11, 2, 16)), r"same sequence length, got 12 and 11"),
    "gqa_multiple": (qkv(k=torch.randn(2, 12, 3, 16), v=torch.randn(2, 12, 3, 16)),
                     r"multiple of the number of key/value heads.*got 4 query heads and 3"),
    "dtype_mismatch": (qkv(k=torch.randn(2, 12, 2, 16, dtype=torch.float16)),
                       r"same dtype, got float, c10::Half and float|same dtype"),
    "unsupported_dtype": (qkv(q=torch.randint(0, 5, (2, 10, 4, 16)),
                              k=torch.randint(0, 5, (2, 12, 2, 16)),
                              v=torch.randint(0, 5, (2, 12, 2, 16))),
                          r"q has dtype Long, which the CPU kernels do not support"),
    "last_dim_stride": (qkv(q=torch.randn(2, 10, 4, 32)[..., ::2]),
                        r"q must be contiguous in its last \(head_dim\) dimension"),
    "meta_device": (qkv(k=torch.randn(2, 12, 2, 16, device="meta")),
                    r"k must be on the same device as q"),
    "zero_head_dim": (qkv(q=torch.randn(2, 10, 4, 0), k=torch.randn(2, 12, 2, 0),
                          v=torch.randn(2, 12, 2, 0)),
                      r"head_dim is 0 \(q has shape \[2, 10, 4, 0\]\), so the default "
                      r"softmax_scale 1/sqrt\(head_dim\) is infinite"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_errors(case):
    tensors, message = BAD_INPUTS[case]
    with pytest.raises(RuntimeError, match=message):
        flashattn.flash_attn_func(**tensors)


@pytest.mark.parametrize("window,message", [
    ((-2, 0), r"window_size\[0\] \(left\) must be -1 \(unbounded\) or >= 0, got -2"),
    ((0, -5), r"window_size\[1\] \(right\) must be -1 \(unbounded\) or >= 0, got -5"),
])
def test_malformed_window(window, message):
    with pytest.raises(RuntimeError, match=message):
        flashattn.flash_attn_func(**qkv(), window_size=window)


@pytest.mark.parametrize("window", [(1,), (1, 2, 3), (1.5, 2), "ab"])
def test_window_must_be_int_pair(window):
    with pytest.raises(ValueError, match=r"window_size must be a pair of ints"):
        flashattn.flash_attn_func(**qkv(), window_size=window)


@pytest.mark.parametrize("slopes,message", [
    (torch.rand(3), r"alibi_slopes must have shape \[4\] or \[2, 4\].*got \[3\]"),
    (torch.rand(4, 2), r"alibi_slopes must have shape \[4\] or \[2, 4\].*got \[4, 2\]"),
    (torch.rand(4, dtype=torch.float64), r"alibi_slopes must be float32, got Double"),
])
def test_alibi_slopes_validation(slopes, message):
    with pytest.raises(RuntimeError, match=message):
        flashattn.flash_attn_func(**qkv(), alibi_slopes=slopes)


def test_sdpa_bad_arguments():
    q, k, v = (torch.randn(2, 4, 10, 16) for _ in range(3))
    with pytest.raises(ValueError, match=r"query must be 4-D \(batch, heads, seqlen, head_dim\)"):
        flashattn.scaled_dot_product_attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"query has 4 heads but key has 2; pass enable_gqa"):
        flashattn.scaled_dot_product_attention(q, k[:, :2], v[:, :2])


def test_cuda_inputs_give_a_clear_error_when_mixed_with_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    t = qkv()
    with pytest.raises(RuntimeError, match=r"must be on the same device as q"):
        flashattn.flash_attn_func(t["q"], t["k"].cuda(), t["v"])


# ----------------------------------------------------------------------------------------------
# Arguments in every form FlashAttention-2 and F.sdpa accept them.

def _reference_call(**kwargs):
    """q, k, v and flash_attn_func's result with plain Python arguments."""
    t = qkv()
    return t, flashattn.flash_attn_func(**t, **kwargs)


@pytest.mark.parametrize("window", [
    [6, 2], torch.tensor([6, 2]), torch.tensor([6, 2], dtype=torch.int32),
    np.array([6, 2]), (np.int64(6), np.int32(2)), (torch.tensor(6), 2),
], ids=["list", "tensor", "tensor-int32", "numpy-array", "numpy-ints", "0d-tensor-element"])
def test_window_size_forms(window):
    """FA2's own tests pass window_size as torch.randint(0, seqlen_k, (2,))."""
    t, expected = _reference_call(window_size=(6, 2))
    assert torch.equal(flashattn.flash_attn_func(**t, window_size=window), expected)


def test_window_size_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    t, expected = _reference_call(window_size=(6, 2))
    got = flashattn.flash_attn_func(**t, window_size=torch.tensor([6, 2], device="cuda"))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("window", [
    torch.tensor([6.0, 2.0]), torch.tensor([1, 2, 3]), torch.tensor([[6, 2]]).expand(2, 2),
    torch.tensor([True, False]), np.array([1.5, 2.0]), None, 3,
], ids=["float-tensor", "3-tensor", "2d-tensor", "bool-tensor", "float-numpy", "None", "int"])
def test_window_size_rejects_non_integer_pairs(window):
    with pytest.raises(ValueError, match=r"flash_attn_func: window_size must be a pair of ints"):
        flashattn.flash_attn_func(**qkv(), window_size=window)


@pytest.mark.parametrize("to_form", [
    torch.tensor, lambda x: torch.tensor([x]), np.float32, np.float64,
], ids=["0d-tensor", "1-element-tensor", "numpy-float32", "numpy-float64"])
def test_scale_and_softcap_forms(to_form):
    # 0.25 and 3.0 are exact in float32, so every form means the same number.
    t, expected = _reference_call(softmax_scale=0.25, softcap=3.0)
    got = flashattn.flash_attn_func(**t, softmax_scale=to_form(0.25), softcap=to_form(3.0))
    assert torch.equal(got, expected)
    q, k, v = (x.transpose(1, 2) for x in t.values())
    sdpa = flashattn.scaled_dot_product_attention(q, k, v, scale=to_form(0.25), enable_gqa=True)
    assert torch.equal(sdpa, flashattn.scaled_dot_product_attention(q, k, v, scale=0.25,
                                                                    enable_gqa=True))


@pytest.mark.parametrize("name,value", [
    ("softmax_scale", "0.5"), ("softmax_scale", torch.tensor([0.5, 0.5])),
    ("softcap", [1.0]), ("softcap", 1j),
])
def test_scale_and_softcap_must_be_real_numbers(name, value):
    with pytest.raises(TypeError, match=rf"flash_attn_func: {name} must be a real number"):
        flashattn.flash_attn_func(**qkv(), **{name: value})


@pytest.mark.parametrize("layout", ["heads-strided", "batch-heads-transposed"])
def test_alibi_slopes_any_strides(layout):
    """FA2 takes slopes with any batch stride; flashattn reads any strides in place."""
    t = qkv()
    if layout == "heads-strided":
        slopes = torch.rand(4, 2)[:, 0]
    else:
        slopes = torch.rand(4, 2).t()
    assert not slopes.is_contiguous()
    expected = flashattn.flash_attn_func(**t, causal=True, alibi_slopes=slopes.contiguous())
    assert torch.equal(flashattn.flash_attn_func(**t, causal=True, alibi_slopes=slopes), expected)


def test_alibi_slopes_must_be_float32():
    """FA2 refuses fp16 slopes too; converting them would be a silent copy."""
    with pytest.raises(RuntimeError, match=r"alibi_slopes must be float32, got Half"):
        flashattn.flash_attn_func(**qkv(), alibi_slopes=torch.rand(4, dtype=torch.float16))


# ----------------------------------------------------------------------------------------------
# Packed inputs: flash_attn_qkvpacked_func and flash_attn_kvpacked_func.

def test_packed_signatures_match_fa2():
    tail = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)
    for fn, leading in ((flashattn.flash_attn_qkvpacked_func, ["qkv"]),
                        (flashattn.flash_attn_kvpacked_func, ["q", "kv"])):
        params = inspect.signature(fn).parameters
        assert list(params) == [*leading, *tail]
        assert {name: params[name].default for name in tail} == tail


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_qkvpacked_reads_the_packed_tensor_in_place(dtype):
    qkv_packed = torch.randn(2, 37, 3, 4, 16, dtype=dtype, requires_grad=True)
    kwargs = dict(causal=True, window_size=(9, 0), softcap=4.0, return_attn_probs=True)
    (out, lse, _), ops = _record_ops(
        lambda: flashattn.flash_attn_qkvpacked_func(qkv_packed, **kwargs))
    assert "flashattn.fwd.default" in ops
    assert set(ops) <= VIEW_OPS | {"flashattn.fwd.default"}, ops
    q, k, v = qkv_packed.detach().unbind(2)
    ref_out, ref_lse, _ = flashattn.flash_attn_func(q, k, v, **kwargs)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    # The gradient reaches the packed tensor, slice by slice.
    dout = torch.randn_like(out)
    out.backward(dout)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    flashattn.flash_attn_func(*leaves, **kwargs)[0].backward(dout)
    assert torch.equal(qkv_packed.grad, torch.stack([x.grad for x in leaves], dim=2))


def test_kvpacked_with_gqa():
    q = torch.randn(2, 20, 6, 32, requires_grad=True)
    kv = torch.randn(2, 33, 2, 2, 32, requires_grad=True)
    (out, ops) = _record_ops(lambda: flashattn.flash_attn_kvpacked_func(q, kv, causal=True))
    assert set(ops) <= VIEW_OPS | {"flashattn.fwd.default"}, ops
    k, v = kv.detach().unbind(2)
    ref, _ = attention_reference(q.detach().double(), k.double(), v.double(), causal=True)
    assert_within_torch_error("kvpacked out", out, ref,
                              attention_reference(q.detach(), k, v, causal=True)[0])
    out.sum().backward()
    assert kv.grad.shape == kv.shape and q.grad.shape == q.shape


@pytest.mark.parametrize("fn,args,message", [
    ("flash_attn_qkvpacked_func", lambda: (torch.randn(2, 10, 2, 4, 16),),
     r"qkv must be a 5-D tensor \(batch, seqlen, 3, nheads, headdim\), got \(2, 10, 2, 4, 16\)"),
    ("flash_attn_qkvpacked_func", lambda: (torch.randn(2, 10, 4, 16),),
     r"qkv must be a 5-D tensor .*got \(2, 10, 4, 16\)"),
    ("flash_attn_kvpacked_func", lambda: (torch.randn(2, 10, 4, 16), torch.randn(2, 10, 3, 4, 16)),
     r"kv must be a 5-D tensor \(batch, seqlen_k, 2, nheads_k, headdim\)"),
])
def test_packed_shape_errors(fn, args, message):
    with pytest.raises(ValueError, match=rf"{fn}: {message}"):
        getattr(flashattn, fn)(*args())
