"""Backward: gradients against float64 autograd through the reference, gradcheck, the LSE
gradient, masked rows, GQA and bitwise determinism."""

import pytest
import torch

import flashattn
from executors import EXECUTORS, make_executor
from flashattn.reference import attention_reference
from test_forward import MASKS, check_forward, make_qkv, mask_arguments
from tolerance import assert_within_torch_error


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
    to64 = lambda t: t.detach().cpu().double()  # noqa: E731
    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(),
                          None if dlse is None else dlse.double(), ref_kwargs)
    low = reference_grads(q, k, v, dout, dlse, ref_kwargs)
    for name, got, want, yardstick in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        assert got.dtype == q.dtype
        assert_within_torch_error(name, got.cpu(), want, yardstick, factor=3.0)
    return dq, dk, dv


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("seqlens", [(1, 1), (7, 65), (65, 7), (63, 129), (129, 63), (257, 257)],
                         ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("mask", ["none", "causal", "window_causal", "softcap_causal",
                                  "alibi_batch_causal", "causal_top_left", "all"])
def test_backward_matrix(executor, dtype, seqlens, mask):
    ex = make_executor(executor)
    q, k, v = make_qkv(2, *seqlens, 2, 2, 32, dtype, ex.device)
    check_backward(ex, q, k, v, MASKS[mask])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("head_dim", [8, 63, 128, 256])
def test_backward_head_dims(executor, head_dim):
    ex = make_executor(executor)
    q, k, v = make_qkv(1, 70, 45, 2, 1, head_dim, torch.bfloat16, ex.device)
    check_backward(ex, q, k, v, MASKS["window"])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("seqlens", [(33, 129), (129, 33), (97, 97)],
                         ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("mask", ["none", "causal", "window_causal", "softcap_causal",
                                  "alibi_batch_causal"])
def test_backward_wide_heads(executor, seqlens, mask):
    """From head_dim 128 the CPU backward tiles 32 queries, not 64 (bwd.cpp): query counts
    across that boundary, with GQA, in fp32."""
    ex = make_executor(executor)
    q, k, v = make_qkv(1, *seqlens, 2, 1, 128, torch.float32, ex.device)
    check_backward(ex, q, k, v, MASKS[mask])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("heads,heads_kv", [(6, 2), (4, 1)])
def test_backward_gqa(executor, heads, heads_kv):
    ex = make_executor(executor)
    q, k, v = make_qkv(2, 80, 100, heads, heads_kv, 32, torch.float32, ex.device)
    check_backward(ex, q, k, v, MASKS["causal"])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("mask", ["none", "causal", "alibi_batch_causal"])
def test_lse_gradient(executor, mask):
    """dLSE folds into D, so losses through the LSE (ring attention merges) get exact grads."""
    ex = make_executor(executor)
    q, k, v = make_qkv(2, 90, 70, 2, 2, 32, torch.float32, ex.device)
    check_backward(ex, q, k, v, MASKS[mask], with_dlse=True)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fully_masked_rows_have_zero_gradient(executor):
    ex = make_executor(executor)
    q, k, v = make_qkv(1, 60, 25, 2, 2, 16, torch.float32, ex.device)
    dq, _, _ = check_backward(ex, q, k, v, MASKS["causal"], with_dlse=True)
    assert torch.equal(dq[:, :35], torch.zeros_like(dq[:, :35]))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_overlapping_rows(executor, dtype):
    """Inputs expanded along the sequence (row stride 0, e.g. one key broadcast to every
    position) and q with a row stride below head_dim: rows overlap, so kernels that read rows
    in place must not take the stride as a GEMM leading dimension."""
    ex = make_executor(executor)
    k, v = (torch.randn(2, 1, 2, 48, dtype=dtype, device=ex.device).expand(2, 90, 2, 48)
            for _ in range(2))
    q = torch.randn(2, 70 * 16 + 48, dtype=dtype, device=ex.device).as_strided(
        (2, 70, 2, 48), (70 * 16 + 48, 16, 8, 1))
    assert k.stride(1) == 0 and q.stride(1) < q.shape[-1]
    check_forward(ex, q, k, v, MASKS["causal"])
    check_backward(ex, q, k, v, MASKS["causal"])


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


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("mask", ["none", "all"])
def test_backward_is_bitwise_deterministic(executor, mask):
    assert_bitwise_deterministic(make_executor(executor), torch.float32, mask)


def test_gradcheck_float64():
    """Numerical vs analytical Jacobians in float64. Only `out` is checked here: the LSE output
    is float32 by contract, too coarse for finite differences with eps=1e-6; its gradient is
    checked against float64 autograd in test_lse_gradient instead."""
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 6, 9, 2, 1, 4, torch.float64, "cpu"))
    alibi = torch.tensor([0.3, 0.7])
    assert torch.autograd.gradcheck(
        lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, softcap=1.5,
                                                  window_size=(4, -1), alibi_slopes=alibi),
        (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               enable_gqa=True),
        tuple(t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)))
