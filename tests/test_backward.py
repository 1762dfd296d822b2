"""Backward: gradients against float64 autograd through the reference, gradcheck, the LSE
gradient, masked rows, GQA and bitwise determinism."""

import math

import pytest
import torch

import flashattn
from checks import (MASKS, assert_bitwise_deterministic, check_backward, check_forward,
                    executor_dtype_params, make_qkv, make_qkv_far_below_zero)
from executors import EXECUTORS, make_executor


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
@pytest.mark.parametrize("logit_std", [2, 4])
@pytest.mark.parametrize("seqlen,heads_kv", [(8, 2), (8, 1), (33, 2)],
                         ids=["s8", "s8-gqa", "s33"])
def test_backward_nearly_one_hot(executor, logit_std, seqlen, heads_kv):
    """Widely spread logits over few keys: a row's largest P is nearly 1, where PyTorch's math
    path is exact to an ulp, so P = exp(S - lse) is only as good as the backward's S agrees with
    the forward's. The CPU's fp32 dV was 3.8-8x PyTorch's error at S = 8 while the backward
    recomputed S with other products than the forward's row products (docs/lab,
    2026-12-02-reliability.md). Beyond std 4 the float32 LSE's own rounding starts to count
    (at 16, dq exceeded the bound in 2 seeds of 80 here; at 64 flashattn and PyTorch's fused
    CPU kernel both do in ~1 of 8: README, Limitations)."""
    ex = make_executor(executor)
    q, k, v = make_qkv(4, seqlen, seqlen, 2, heads_kv, 32, torch.float32, ex.device)
    check_backward(ex, q, k, v, {"scale": logit_std / math.sqrt(32)})


@pytest.mark.parametrize("row_lanes", ["8", "auto"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seqlen_q", [1, 8, 17, 127, 300])
def test_cpu_backward_recomputes_the_forward_scores(monkeypatch, row_lanes, head_dim, seqlen_q):
    """With one key, each row's P is exactly 1 when the backward's S is the forward's bit for
    bit (exp(S - lse) = exp(0)). A one-hot dO picks one row's P out: dV = P. Before the backward
    took the forward's products (the row dots below 16 rows per kv head, loops and oneDNN
    agreeing on the tiles), P missed 1 in up to 70% of the rows."""
    monkeypatch.setenv("FLASHATTN_CPU_ROW_LANES", row_lanes)
    batch = max(1, 512 // seqlen_q)
    q = torch.randn(batch, seqlen_q, 2, head_dim, requires_grad=True)
    k, v = (torch.randn(batch, 1, 1, head_dim, requires_grad=True) for _ in range(2))
    out = flashattn.flash_attn_func(q, k, v)
    for row in sorted({0, seqlen_q // 2, seqlen_q - 1}):
        dout = torch.zeros_like(out)
        dout[:, row, 0] = 1
        (dv,) = torch.autograd.grad(out, v, dout, retain_graph=True)
        assert torch.equal(dv, torch.ones_like(dv)), f"row {row}: P - 1 up to {(dv - 1).abs().max()}"


@pytest.mark.parametrize("executor", EXECUTORS)
def test_key_seen_by_many_queries(executor):
    """One key that 2048 queries of 4 heads see: its dV sums 8192 products. One chain of fp32
    roundings through all of them (the CPU's small-product loops once added each product into
    dV's running value) drifted to ~7x PyTorch's error; a sum per tile, then of the tiles, stays
    within the bound."""
    ex = make_executor(executor)
    q, k, v = make_qkv(1, 2048, 1, 4, 1, 8, torch.float32, ex.device)
    check_backward(ex, q, k, v, MASKS["none"])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("mask", ["none", "causal", "alibi_batch_causal"])
def test_lse_gradient(executor, mask):
    """dLSE folds into D, so losses through the LSE (ring attention merges) get exact grads."""
    ex = make_executor(executor)
    q, k, v = make_qkv(2, 90, 70, 2, 2, 32, torch.float32, ex.device)
    check_backward(ex, q, k, v, MASKS[mask], with_dlse=True)


# float64 is left out: its gradients are recomputed from the float32 LSE (README, Limitations),
# which check_backward's float64 yardstick cannot allow for.
@pytest.mark.parametrize("executor,dtype",
                         executor_dtype_params(EXECUTORS, [torch.float32, torch.bfloat16,
                                                           torch.float16]))
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_backward_logits_far_below_zero(executor, dtype, mask):
    """Rows whose every logit lies far below zero (checks.make_qkv_far_below_zero): P is
    recomputed from the LSE, exp(S - LSE), which must not underflow with them."""
    ex = make_executor(executor)
    q, k, v = make_qkv_far_below_zero(2, 97, 130, 2, 1, 32, dtype, ex.device)
    check_backward(ex, q, k, v, MASKS[mask])


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
