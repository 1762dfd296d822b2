"""A value head dim different from the query's (DeepSeek's Multi-head Latent Attention): q and k
share head_dim, v (and out, dout, dv) have head_dim_v. The CPU takes any pair, forward and
backward, through every entry point (the CUDA kernels' pairs: test_cudasim_mla.py). Each result
is checked against the float64 reference, PyTorch's own error in the dtype being the yardstick."""
import pytest
import torch

import flashattn
from checks import MASKS, mask_arguments, reference_grads, to64
from executors import make_executor
from flashattn._reference import attention_reference
from test_kvcache import Case
from tolerance import assert_within_torch_error
from varlen_checks import VarlenBatch, varlen_reference

# (head_dim, head_dim_v): MLA training / prefill, a halved v, a wider v, and the absorbed decode.
PAIRS = [(192, 128), (128, 64), (64, 128), (576, 512)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, dims, dtype, device="cpu"):
    head_dim, head_dim_v = dims
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim_v, dtype=dtype, device=device)
    return q, k, v


def check_forward_and_backward(q, k, v, mask, ex=None, bwd_arguments=None, **op_arguments):
    """The op forward and backward on executor ex (the CPU's by default) against the reference;
    op_arguments (dropout) go to both directions, bwd_arguments (deterministic) to the backward.
    Returns out."""
    ex = ex or make_executor("cpu")
    scale, op_kwargs, ref_kwargs = mask_arguments(mask, q)
    op_kwargs.update(op_arguments)
    out, lse = ex.fwd(q, k, v, scale, **op_kwargs)
    assert out.shape == (*q.shape[:-1], v.shape[-1]) and out.dtype == q.dtype
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    low_out, low_lse = attention_reference(q, k, v, **ref_kwargs)
    assert_within_torch_error("out", out, ref_out, low_out)
    assert_within_torch_error("lse", lse, ref_lse, low_lse.float())
    # float64's gradients are recomputed from the float32 LSE (README, Limitations), which its
    # yardstick (PyTorch exact to the reference) cannot allow for: test_gradcheck covers them.
    if q.dtype == torch.float64:
        return out
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    grads = ex.bwd(dout, q, k, v, out, lse, dlse, scale, **op_kwargs, **(bwd_arguments or {}))
    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(), dlse.double(), ref_kwargs)
    low = reference_grads(q, k, v, dout, dlse, ref_kwargs)
    for name, got, want, yardstick, like in zip(("dq", "dk", "dv"), grads, ref, low, (q, k, v)):
        assert got.shape == like.shape and got.dtype == q.dtype
        assert_within_torch_error(name, got, want, yardstick, factor=3.0)
    return out


# ---- the op on the CPU ----

@pytest.mark.parametrize("dims", PAIRS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", ["none", "causal", "window", "softcap_causal", "alibi"])
def test_cpu_matches_the_reference(dims, dtype, mask):
    """GQA (6 query heads on 2 kv heads), Sq != Sk both ways at awkward sizes."""
    for seqlen_q, seqlen_k in ((65, 129), (127, 63)):
        q, k, v = make_qkv(2, seqlen_q, seqlen_k, 6, 2, dims, dtype)
        check_forward_and_backward(q, k, v, MASKS[mask])


@pytest.mark.parametrize("dims", [(7, 1), (1, 7), (63, 65), (129, 257)], ids=str)
@pytest.mark.parametrize("seqlens", [(1, 1), (7, 257), (257, 7)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_awkward_sizes_and_dims(dims, seqlens, dtype):
    # A batch of 16: the yardstick is PyTorch's largest bf16 error, and over few numbers it is
    # noisy. With one batch entry, dK of (257, 7) at dims (1, 7) is 7 numbers (1 seed in 60 broke
    # it by one ulp); with 4, dQ and dK at qk dim 1 are 112 and 1028 numbers whose largest few
    # decide both maxima (2 seeds in 2300 broke it by about one ulp); with 16, 0 in 2300.
    q, k, v = make_qkv(16, *seqlens, 4, 1, dims, dtype)
    check_forward_and_backward(q, k, v, MASKS["causal"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_decode_rows_and_splits(dtype):
    """A few query rows over many keys: the decode paths (the products from the rows in place,
    split-KV and its merge) with out of v's width."""
    q, k, v = make_qkv(2, 1, 700, 16, 1, (192, 128), dtype)
    ref_out, _ = attention_reference(to64(q), to64(k), to64(v))
    low_out, _ = attention_reference(q, k, v)
    out = flashattn.flash_attn_func(q, k, v)
    assert_within_torch_error("out", out, ref_out, low_out)
    for num_splits in (1, 3):  # split-KV is the KV cache's argument
        out = flashattn.flash_attn_with_kvcache(q, k, v, num_splits=num_splits)
        assert_within_torch_error("out", out, ref_out, low_out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_dropout_drops_the_same_entries_as_the_keep_mask(dtype):
    q, k, v = make_qkv(2, 70, 129, 4, 2, (48, 16), dtype)
    p = 0.17
    rng_state = torch.ops.flashattn.dropout_rng_state(q)
    keep = torch.ops.flashattn.dropout_keep_mask(rng_state, p, 2, 4, 70, 129)
    ex = make_executor("cpu")
    scale = q.shape[-1] ** -0.5
    out, lse = ex.fwd(q, k, v, scale, causal=True, dropout_p=p, rng_state=rng_state)
    ref_kwargs = dict(causal=True, dropout_mask=keep, dropout_p=p)
    ref_out, _ = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    low_out, _ = attention_reference(q, k, v, **ref_kwargs)
    assert_within_torch_error("out", out, ref_out, low_out)
    dout = torch.randn_like(out)
    grads = ex.bwd(dout, q, k, v, out, lse, None, scale, causal=True, dropout_p=p,
                   rng_state=rng_state)
    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(), None, ref_kwargs)
    low = reference_grads(q, k, v, dout, None, ref_kwargs)
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
        assert_within_torch_error(name, got, want, yardstick, factor=3.0)


def test_cpu_strided_layouts_are_read_in_place():
    """v a slice of a wider tensor, q and k (B, H, S, D) views: strides, not copies."""
    qkv = torch.randn(2, 37, 3, 4, 96)
    q, k = qkv[:, :, 0, :, :64], qkv[:, :, 1, :, :64]
    v = qkv[:, :, 2, :, 64:]  # head dim 32, rows 3 * 4 * 96 apart
    assert v.stride(1) == 3 * 4 * 96
    check_forward_and_backward(q, k, v, MASKS["causal"])


# ---- the front ends: autograd, varlen, SDPA, torch.compile, opcheck ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_flash_attn_func_autograd(dtype):
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 33, 65, 8, 2, (192, 128), dtype))
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, 33, 8, 128)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    grads = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), (q, k, v))
    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(), dlse.double(),
                          dict(causal=True))
    low = reference_grads(q.detach(), k.detach(), v.detach(), dout, dlse, dict(causal=True))
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
        assert_within_torch_error(name, got, want, yardstick, factor=3.0)


def test_gradcheck():
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 5, 7, 2, 1, (6, 3), torch.float64))

    def attend(q, k, v):
        return flashattn.flash_attn_func(q, k, v, causal=True, softcap=2.0)

    assert torch.autograd.gradcheck(attend, (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_varlen(dtype):
    vb = VarlenBatch([0, 1, 65, 17, 129], [7, 63, 1, 129, 40], extra_q=3, extra_k=2)
    q = torch.randn(vb.total_q, 4, 128, dtype=dtype)
    k = torch.randn(vb.total_k, 2, 128, dtype=dtype)
    v = torch.randn(vb.total_k, 2, 64, dtype=dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    lengths = vb.op_arguments("cpu")
    out = flashattn.flash_attn_varlen_func(
        q, k, v, lengths["cu_seqlens_q"], lengths["cu_seqlens_k"], lengths["max_seqlen_q"],
        lengths["max_seqlen_k"], causal=True)
    assert out.shape == (vb.total_q, 4, 64)
    ref_kwargs = dict(causal=True)
    ref_out, _ = varlen_reference(to64(q), to64(k), to64(v), vb, ref_kwargs)
    low_out, _ = varlen_reference(q.detach(), k.detach(), v.detach(), vb, ref_kwargs)
    assert_within_torch_error("out", out.detach(), ref_out, low_out)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves64 = [to64(t).requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(varlen_reference(*leaves64, vb, ref_kwargs)[0], leaves64,
                              dout.double())
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    low = torch.autograd.grad(varlen_reference(*leaves, vb, ref_kwargs)[0], leaves, dout)
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), grads, ref, low):
        assert_within_torch_error(name, got, want, yardstick, factor=3.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_dot_product_attention(dtype):
    """flashattn's SDPA entry: value (B, H, S, Ev) with Ev != E, as torch allows."""
    query = torch.randn(2, 4, 37, 64, dtype=dtype, requires_grad=True)
    key = torch.randn(2, 2, 50, 64, dtype=dtype, requires_grad=True)
    value = torch.randn(2, 2, 50, 24, dtype=dtype, requires_grad=True)
    out = flashattn.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                 enable_gqa=True)
    assert out.shape == (2, 4, 37, 24)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (query, key, value), dout)

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True)

    leaves64 = [to64(t).requires_grad_() for t in (query, key, value)]
    ref_out = sdpa(*leaves64)
    ref = torch.autograd.grad(ref_out, leaves64, dout.double())
    leaves = [t.detach().clone().requires_grad_() for t in (query, key, value)]
    low_out = sdpa(*leaves)
    low = torch.autograd.grad(low_out, leaves, dout)
    assert_within_torch_error("out", out.detach(), ref_out.detach(), low_out.detach())
    for name, got, want, yardstick in zip(("dquery", "dkey", "dvalue"), grads, ref, low):
        assert_within_torch_error(name, got, want, yardstick, factor=3.0)


def test_sdpa_rejects_a_key_of_another_head_dim():
    query = torch.randn(1, 2, 8, 16)
    with pytest.raises(RuntimeError, match=r"key must have query's head_dim 16 \(dim 3\)"):
        flashattn.scaled_dot_product_attention(query, torch.randn(1, 2, 8, 12), query)


def test_compile_forward_and_backward():
    """The fake kernels give out and dv v's head dim: torch.compile(fullgraph=True) agrees with
    eager, forward and backward, through flash_attn_func and the SDPA entry."""
    torch._dynamo.reset()
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 19, 23, 4, 2, (40, 24), torch.float32))

    def step(q, k, v):
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        sdpa = flashattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                      v.transpose(1, 2), enable_gqa=True)
        assert out.shape[-1] == sdpa.shape[-1] == 24
        return out.square().sum() + sdpa.sum()

    loss = torch.compile(step, fullgraph=True)(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    eager_loss = step(q, k, v)
    eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
    torch.testing.assert_close(loss, eager_loss)
    for got, want in zip(grads, eager_grads):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def test_opcheck():
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 9, 13, 4, 2, (24, 8), torch.float32))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v), dict(causal=True))
    q, k, v = q.detach(), k.detach(), v.detach()  # bwd has no derivative of its own
    out, lse = torch.ops.flashattn.fwd(q, k, v, causal=True)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (torch.randn_like(out), out, lse, None, q, k, v), dict(causal=True))
    cache = torch.randn(2, 16, 2, 24)
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default,
                          (q, cache, cache[..., :8]), dict(num_splits=1))


# ---- errors ----

def test_bad_shapes_are_errors_naming_the_argument():
    q, k, v = make_qkv(1, 8, 8, 2, 2, (32, 16), torch.float32)
    with pytest.raises(RuntimeError, match=r"q and k must have the same head dim, got 32 and 31"):
        torch.ops.flashattn.fwd(q, k[..., :31], v)
    out, lse = torch.ops.flashattn.fwd(q, k, v)
    for name, wrong in (("out", q), ("dout", q)):
        grads = dict(dout=out, out=out)
        grads[name] = wrong
        with pytest.raises(RuntimeError, match=rf"{name} must have q's shape with v's head dim, "
                                               r"\[1, 8, 2, 16\], got \[1, 8, 2, 32\]"):
            torch.ops.flashattn.bwd(grads["dout"], grads["out"], lse, None, q, k, v)


# ---- the KV cache ----

@pytest.mark.parametrize("dims", PAIRS, ids=str)
@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kvcache_with_a_separate_value_cache(dims, layout, dtype):
    """k_cache head_dim, v_cache head_dim_v, with an append of k and v and rotary on k."""
    head_dim, head_dim_v = dims
    Case(head_dim=head_dim, head_dim_v=head_dim_v, seqlen_q=2, seqlen_new=2, seqlen_cache=150,
         page_size=16 if layout == "paged" else None, rotary_dim=16, dtype=dtype).check()


@pytest.mark.parametrize("layout", ["dense", "paged"])
@pytest.mark.parametrize("seqlen_new", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kvcache_values_inside_the_keys(layout, seqlen_new, dtype):
    """v_cache = k_cache[..., :head_dim_v]: read where it is, and an append of k alone writes
    the values with the keys."""
    case = Case(head_dim=96, head_dim_v=64, heads=8, heads_kv=1, seqlen_q=max(seqlen_new, 1),
                seqlen_new=seqlen_new, seqlen_cache=200, rotary_dim=0,
                page_size=32 if layout == "paged" else None, dtype=dtype, values_in_keys=True)
    assert case.v_cache.data_ptr() == case.k_cache.data_ptr()
    case.check()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_deepseek_v3_mla_decode(dtype):
    """DeepSeek-V3's absorbed decode step: 128 query heads on one latent kv head, head dims
    576 / 512, V the first 512 columns of K's rows, a paged cache of 64-row pages."""
    Case(batch=2, seqlen_q=1, heads=128, heads_kv=1, head_dim=576, head_dim_v=512,
         seqlen_cache=300, seqlen_new=1, page_size=64, rotary_dim=0, dtype=dtype,
         values_in_keys=True).check()


def test_kvcache_append_with_values_inside_the_keys_takes_k_alone():
    case = Case(head_dim=32, head_dim_v=16, seqlen_new=1, rotary_dim=0, dtype=torch.float32,
                values_in_keys=True)
    v = torch.randn(case.batch, 1, case.k_cache.shape[2], 16)
    with pytest.raises(RuntimeError, match=r"v_cache is k_cache\[\.\.\., :16\] \(each value is "
                                           r"the start of its key row\), so appending k writes "
                                           r"the values too; pass v=None"):
        case.call(v=v)
    angle = torch.rand(400, 8)
    with pytest.raises(RuntimeError, match=r"the values would be rotated too"):
        case.call(rotary_cos=angle.cos(), rotary_sin=angle.sin())
    # Any other overlap of the caches is still refused when appending.
    with pytest.raises(RuntimeError, match=r"v_cache and k_cache share memory"):
        flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.k_cache[..., 16:], k=case.k,
                                          v=v, cache_seqlens=case.cache_seqlens)
    with pytest.raises(RuntimeError, match=r"pass both k and v"):
        flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.k_cache[..., 16:].clone(),
                                          k=case.k, cache_seqlens=case.cache_seqlens)
