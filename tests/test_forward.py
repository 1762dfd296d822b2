"""Forward correctness matrix: every executor against the float64 reference, with PyTorch's own
low-precision error as the yardstick (the checks themselves are in checks.py)."""
import pytest
import torch

from checks import (MASKS, NAN_CASES, check_forward, check_nan_propagation, executor_dtype_params,
                    make_qkv, make_qkv_far_below_zero, supports)
from executors import EXECUTORS, make_executor

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (seqlen_q, seqlen_k): awkward sizes around tile edges, Sq != Sk both ways.
SEQLENS = [(1, 1), (7, 7), (1, 129), (129, 1), (63, 65), (65, 63), (127, 257), (257, 127), (129, 129)]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("mask", list(MASKS), ids=str)
def test_forward_matrix(executor, dtype, seqlens, mask):
    ex = make_executor(executor)
    q, k, v = make_qkv(2, *seqlens, 2, 2, 64, dtype, ex.device)
    check_forward(ex, q, k, v, MASKS[mask])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("head_dim", [1, 8, 32, 63, 80, 96, 128, 160, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_head_dims(executor, head_dim, dtype):
    ex = make_executor(executor)
    q, k, v = make_qkv(1, 65, 97, 2, 2, head_dim, dtype, ex.device)
    check_forward(ex, q, k, v, MASKS["causal"])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("heads,heads_kv", [(6, 2), (4, 1), (3, 3)])
@pytest.mark.parametrize("mask", ["none", "causal", "alibi_batch_causal"])
def test_gqa(executor, heads, heads_kv, mask):
    ex = make_executor(executor)
    q, k, v = make_qkv(2, 70, 90, heads, heads_kv, 32, torch.bfloat16, ex.device)
    check_forward(ex, q, k, v, MASKS[mask])


@pytest.mark.parametrize("executor,dtype",
                         executor_dtype_params(EXECUTORS, [torch.float32, torch.float64,
                                                           torch.bfloat16, torch.float16]))
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_logits_far_below_zero(executor, dtype, mask):
    """Rows whose every logit is so far below zero that exp of each underflows (checks.py,
    FAR_BELOW_ZERO), next to ordinary rows: only a running max that starts at -inf keeps them."""
    ex = make_executor(executor)
    check_forward(ex, *make_qkv_far_below_zero(2, 97, 300, 2, 1, 64, dtype, ex.device),
                  MASKS[mask])


@pytest.mark.parametrize("executor", [e for e in EXECUTORS if supports(e, torch.float64)])
def test_float64(executor):
    ex = make_executor(executor)
    q, k, v = make_qkv(2, 33, 47, 4, 2, 24, torch.float64, ex.device)
    check_forward(ex, q, k, v, MASKS["all"])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_packed_qkv_and_sdpa_layout(executor, dtype):
    """q, k, v as strided slices of one packed tensor, and in (B, H, S, D) memory order."""
    ex = make_executor(executor)
    batch, seqlen, heads, head_dim = 2, 77, 3, 40
    packed = torch.randn(batch, seqlen, 3, heads, head_dim, dtype=dtype, device=ex.device)
    q, k, v = packed.unbind(2)
    assert not q.is_contiguous()
    check_forward(ex, q, k, v, MASKS["causal"])
    bhsd = torch.randn(3, batch, heads, seqlen, head_dim, dtype=dtype, device=ex.device)
    q, k, v = (t.transpose(1, 2) for t in bhsd.unbind(0))
    check_forward(ex, q, k, v, MASKS["window"])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_scale_is_applied(executor):
    ex = make_executor(executor)
    q, k, v = make_qkv(1, 40, 50, 2, 2, 16, torch.float32, ex.device)
    check_forward(ex, q, k, v, MASKS["none"], scale=0.37)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("shape", [(0, 5, 2, 2, 8), (2, 0, 2, 2, 8), (2, 5, 0, 2, 8),
                                   (2, 5, 2, 0, 8)],
                         ids=["batch0", "sq0", "sk0", "heads0"])
def test_empty_inputs(executor, shape):
    ex = make_executor(executor)
    batch, seqlen_q, seqlen_k, heads, head_dim = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads, head_dim, torch.float32,
                       ex.device)
    out, lse = ex.fwd(q, k, v, 0.5, causal=True)
    assert out.shape == q.shape and lse.shape == (batch, heads, seqlen_q)
    if seqlen_k == 0:  # every row sees nothing
        assert torch.equal(out, torch.zeros_like(out))
        assert torch.equal(lse, torch.full_like(lse, float("-inf")))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fully_masked_rows_are_zero(executor):
    """Bottom-right causal with Sq > Sk: the top Sq - Sk rows see no key."""
    ex = make_executor(executor)
    q, k, v = make_qkv(1, 50, 20, 2, 2, 16, torch.bfloat16, ex.device)
    out, lse = check_forward(ex, q, k, v, MASKS["causal"])
    assert torch.equal(out[:, :30].float(), torch.zeros_like(out[:, :30].float()))
    assert torch.isneginf(lse[:, :, :30]).all()
    assert torch.isfinite(lse[:, :, 30:]).all()


@pytest.mark.parametrize("executor,dtype",
                         executor_dtype_params(EXECUTORS, [torch.float32, torch.bfloat16,
                                                           torch.float64]))
@pytest.mark.parametrize("where,mask", NAN_CASES)
def test_nan_inputs_propagate(executor, dtype, where, mask):
    ex = make_executor(executor)
    check_nan_propagation(ex, *make_qkv(1, 150, 140, 2, 2, 64, dtype, ex.device), where, mask)
