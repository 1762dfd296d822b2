"""Forward correctness matrix: every executor against the float64 reference, with PyTorch's own
low-precision error as the yardstick."""
import math

import pytest
import torch

from executors import EXECUTORS, make_executor
from flashattn.reference import attention_reference
from tolerance import assert_within_torch_error

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (seqlen_q, seqlen_k): awkward sizes around tile edges, Sq != Sk both ways.
SEQLENS = [(1, 1), (7, 7), (1, 129), (129, 1), (63, 65), (65, 63), (127, 257), (257, 127), (129, 129)]

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


def make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, device):
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
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


def check_forward(ex, q, k, v, mask, scale=None):
    """Runs executor ex and compares out and lse with the float64 reference."""
    scale, op_kwargs, ref_kwargs = mask_arguments(mask, q, scale)
    out, lse = ex.fwd(q, k, v, scale, **op_kwargs)
    to64 = lambda t: t.detach().cpu().double()  # noqa: E731
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    low_out, low_lse = attention_reference(q.cpu(), k.cpu(), v.cpu(), **ref_kwargs)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert_within_torch_error("out", out.cpu(), ref_out, low_out)
    assert_within_torch_error("lse", lse.cpu(), ref_lse, low_lse.float())
    return out, lse


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


@pytest.mark.parametrize("executor", EXECUTORS)
def test_float64(executor):
    ex = make_executor(executor)
    if ex.name != "cpu":
        pytest.skip("float64 is a CPU-only dtype")
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
    to64 = lambda t: t.detach().cpu().double()  # noqa: E731
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), **ref_kwargs)
    assert ref_out.isnan().any()
    assert torch.equal(out.isnan().cpu(), ref_out.isnan())
    assert torch.equal(lse.isnan().cpu(), ref_lse.isnan())


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("where,mask", NAN_CASES)
def test_nan_inputs_propagate(executor, dtype, where, mask):
    ex = make_executor(executor)
    if dtype == torch.float64 and ex.device != "cpu":
        pytest.skip("float64 is a CPU dtype")
    check_nan_propagation(ex, *make_qkv(1, 150, 140, 2, 2, 64, dtype, ex.device), where, mask)
