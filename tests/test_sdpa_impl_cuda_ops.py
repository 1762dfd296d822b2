"""The replacements for ATen's CUDA flash-attention ops (csrc/sdpa_impl.h), which
activate_flash_attention_impl("flashattn") installs on CUDA, run on the CPU shim.

The sim extension defines torch.ops.flashattn_sim.<op> with ATen's own schema strings and the
same boxed kernels as the GPU build, so these tests check what a GPU cannot be asked here:
values against the float64 reference, through the same checks as the flashattn ops, and every
output's shape, strides and dtype against ATen's meta function for the op (what torch.compile
assumes). test_sdpa_impl.py covers activation itself, on the CPU ops."""
import pytest
import torch

from checks import MASKS, check_backward, check_forward, make_qkv, to64
from executors import make_executor
from flashattn._reference import attention_reference
from tolerance import assert_within_torch_error
from varlen_checks import check_varlen, shuffled_awkward_batch

aten = torch.ops.aten


@pytest.fixture(scope="module")
def sim_ops():
    return make_executor("sim").ops


class FlashOpExecutor:
    """aten._flash_attention_forward / _backward as replaced, with the Executor interface of
    executors.py, so checks.py and varlen_checks.py run them unchanged. FA2's layout: q
    (batch, seqlen, heads, head_dim) or packed (total, heads, head_dim)."""
    name, device = "sim-aten-flash", torch.device("cpu")

    def __init__(self, ops):
        self.ops = ops

    @staticmethod
    def _lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        if cu_seqlens_q is None:
            return q.shape[1], k.shape[1]
        return max_seqlen_q, max_seqlen_k

    def fwd(self, q, k, v, softmax_scale, window=(-1, -1), causal=False, alibi_slopes=None,
            cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
            seqused_k=None, dropout_p=0.0, align_bottom_right=True):
        assert align_bottom_right, "ATen's flash ops align causal masks bottom-right only"
        max_q, max_k = self._lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k)
        out, lse, self.rng_state, self.unused, _ = self.ops._flash_attention_forward(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, dropout_p, causal, False,
            scale=softmax_scale, window_size_left=window[0], window_size_right=window[1],
            seqused_k=seqused_k, alibi_slopes=alibi_slopes)
        return out, lse

    def bwd(self, dout, q, k, v, out, lse, dlse, softmax_scale, window=(-1, -1), causal=False,
            cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
            dropout_p=0.0, deterministic=False, align_bottom_right=True, alibi_slopes=None):
        assert dlse is None, "ATen's ops have no LSE gradient"
        assert alibi_slopes is None, "ATen's backward ops take no alibi_slopes"
        max_q, max_k = self._lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                     max_seqlen_k)
        with DeterministicAlgorithms(deterministic):
            return self.ops._flash_attention_backward(
                dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_q, max_k, dropout_p,
                causal, self.rng_state, self.unused, scale=softmax_scale,
                window_size_left=window[0], window_size_right=window[1])


class SdpaOpExecutor(FlashOpExecutor):
    """aten._scaled_dot_product_flash_attention / _backward as replaced: the same interface,
    the inputs handed over as the (batch, heads, seqlen, head_dim) views F.sdpa passes."""
    name = "sim-aten-sdpa"

    def fwd(self, q, k, v, softmax_scale, window=(-1, -1), causal=False, dropout_p=0.0,
            alibi_slopes=None):
        assert window == (-1, -1) and alibi_slopes is None
        out, lse, cum_q, cum_k, max_q, max_k, self.rng_state, self.unused, _ = \
            self.ops._scaled_dot_product_flash_attention(
                *(t.transpose(1, 2) for t in (q, k, v)), dropout_p, causal, scale=softmax_scale)
        assert (cum_q, cum_k, max_q, max_k) == (None, None, q.shape[1], k.shape[1])
        return out.transpose(1, 2), lse

    def bwd(self, dout, q, k, v, out, lse, dlse, softmax_scale, window=(-1, -1), causal=False,
            dropout_p=0.0, deterministic=False, alibi_slopes=None):
        assert dlse is None and window == (-1, -1) and alibi_slopes is None
        with DeterministicAlgorithms(deterministic):
            grads = self.ops._scaled_dot_product_flash_attention_backward(
                *(t.transpose(1, 2) for t in (dout, q, k, v, out)), lse, None, None, q.shape[1],
                k.shape[1], dropout_p, causal, self.rng_state, self.unused, scale=softmax_scale)
        return tuple(g.transpose(1, 2) for g in grads)


class DeterministicAlgorithms:
    """torch.use_deterministic_algorithms(flag) for a block; ATen's flash ops follow it."""

    def __init__(self, flag):
        self.flag = flag

    def __enter__(self):
        self.before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(self.flag)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.before)


# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim): awkward sizes, Sq != Sk both ways, GQA.
SHAPES = [(2, 65, 70, 3, 3, 64), (1, 7, 129, 4, 2, 32), (2, 129, 63, 2, 1, 128), (1, 1, 1, 2, 2, 32)]
DTYPES = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["none", "causal", "window", "window_causal"])
def test_flash_attention_ops_match_the_reference(sim_ops, dtype, shape, mask):
    q, k, v = make_qkv(*shape, dtype, "cpu")
    ex = FlashOpExecutor(sim_ops)
    check_forward(ex, q, k, v, MASKS[mask])
    check_backward(ex, q, k, v, MASKS[mask])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_sdpa_ops_match_the_reference(sim_ops, dtype, shape, mask):
    q, k, v = make_qkv(*shape, dtype, "cpu")
    ex = SdpaOpExecutor(sim_ops)
    check_forward(ex, q, k, v, MASKS[mask], scale=0.3)
    check_backward(ex, q, k, v, MASKS[mask])


@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_flash_attention_ops_on_a_varlen_batch(sim_ops, mask):
    vb = shuffled_awkward_batch(seed=3, extra_q=2, extra_k=3)
    q, k, v = vb.make_qkv(4, 2, 64, torch.bfloat16, "cpu")
    check_varlen(FlashOpExecutor(sim_ops), vb, q, k, v, MASKS[mask])


def test_alibi_and_seqused_k_forward_without_grad(sim_ops):
    """ATen's backward ops get neither: fine for inference, refused where autograd records."""
    vb = shuffled_awkward_batch(seed=4, used_k=[max(n - 5, 0) for n in range(11)])
    vb.lengths_k[:] = [max(n, u) for n, u in zip(vb.lengths_k, vb.used_k)]
    vb.__post_init__()
    q, k, v = vb.make_qkv(2, 2, 32, torch.float16, "cpu")
    check_varlen(FlashOpExecutor(sim_ops), vb, q, k, v, MASKS["alibi_batch_causal"], backward=False)
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="seqused_k is inference-only here"):
        FlashOpExecutor(sim_ops).fwd(q, k, v, None, **vb.op_arguments("cpu"))
    with torch.no_grad():
        FlashOpExecutor(sim_ops).fwd(q, k, v, None, **vb.op_arguments("cpu"))


# ---- layouts: what ATen's meta functions (and so torch.compile) expect ----

def meta_like(t):
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                      device="meta")


def layout(t):
    return (tuple(t.shape), t.stride(), t.dtype) if isinstance(t, torch.Tensor) else t


def assert_layouts_match_meta(results, op, *args, **kwargs):
    expected = op(*(meta_like(a) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
    assert len(results) == len(expected)
    for i, (got, want) in enumerate(zip(results, expected)):
        assert layout(got) == layout(want), f"result {i}"


def sdpa_inputs(kind, dtype):
    """(query, key, value) as F.sdpa hands them over: transposed views of (B, S, H, D) memory
    (what models pass), or contiguous (B, H, S, D)."""
    q, k, v = make_qkv(2, 33, 40, 4, 2, 64, dtype, "cpu")
    if kind == "bshd_memory":
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return (t.transpose(1, 2).contiguous() for t in (q, k, v))


@pytest.mark.parametrize("kind", ["bshd_memory", "bhsd_contiguous"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_sdpa_ops_have_the_meta_layouts(sim_ops, kind, dropout_p):
    q, k, v = sdpa_inputs(kind, torch.bfloat16)
    fwd_args = (q, k, v, dropout_p, True)
    results = sim_ops._scaled_dot_product_flash_attention(*fwd_args, scale=0.2)
    assert_layouts_match_meta(results, aten._scaled_dot_product_flash_attention, *fwd_args,
                              scale=0.2)
    out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, _ = results
    bwd_args = (torch.randn_like(out), q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p,
                True, rng_state, unused)
    grads = sim_ops._scaled_dot_product_flash_attention_backward(*bwd_args, scale=0.2)
    assert_layouts_match_meta(grads, aten._scaled_dot_product_flash_attention_backward,
                              *bwd_args, scale=0.2)


@pytest.mark.parametrize("varlen", [False, True])
def test_flash_attention_ops_have_the_meta_layouts(sim_ops, varlen):
    q, k, v = make_qkv(2, 33, 40, 4, 2, 64, torch.float16, "cpu")
    cum_q = cum_k = None
    max_q, max_k = 33, 40
    if varlen:
        q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
        cum_q = torch.tensor([0, 33, 66], dtype=torch.int32)
        cum_k = torch.tensor([0, 40, 80], dtype=torch.int32)
    fwd_args = (q, k, v, cum_q, cum_k, max_q, max_k, 0.0, True, False)
    results = sim_ops._flash_attention_forward(*fwd_args, window_size_left=5)
    assert_layouts_match_meta(results, aten._flash_attention_forward, *fwd_args,
                              window_size_left=5)
    out, lse, rng_state, unused, _ = results
    bwd_args = (torch.randn_like(out), q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, True,
                rng_state, unused)
    grads = sim_ops._flash_attention_backward(*bwd_args, window_size_left=5)
    assert_layouts_match_meta(grads, aten._flash_attention_backward, *bwd_args,
                              window_size_left=5)


def test_in_place_forward_writes_what_the_forward_returns(sim_ops):
    # ATen's in-place forward is newer than torch 2.11 (the oldest we support, the GPU box's):
    # where torch lacks it, there is nothing to replace and nothing is registered.
    if not hasattr(aten, "_flash_attention_forward_no_dropout_inplace"):
        assert not hasattr(sim_ops, "_flash_attention_forward_no_dropout_inplace")
        return
    q, k, v = make_qkv(1, 65, 65, 2, 2, 32, torch.bfloat16, "cpu")
    args = (q, k, v, None, None, 65, 65, 0.0, True, False)
    out, lse = sim_ops._flash_attention_forward(*args)[:2]
    written = torch.full_like(out, float("nan"))
    lse_in_place = sim_ops._flash_attention_forward_no_dropout_inplace(written, *args)
    assert torch.equal(written, out) and torch.equal(lse_in_place, lse)
    with pytest.raises(RuntimeError, match="takes no dropout"):
        sim_ops._flash_attention_forward_no_dropout_inplace(written, q, k, v, None, None, 65, 65,
                                                            0.1, True, False)


# ---- dropout: ATen's ops carry the seed from forward to backward ----

def test_sdpa_ops_dropout_is_flashattns_mask_and_its_gradient(sim_ops):
    p = 0.25
    q, k, v = make_qkv(2, 65, 70, 3, 3, 64, torch.float16, "cpu")
    ex = SdpaOpExecutor(sim_ops)
    out, lse = ex.fwd(q, k, v, None, causal=False, dropout_p=p)
    assert ex.rng_state.dtype == torch.uint64 and ex.rng_state.shape == (2,)
    keep = torch.ops.flashattn.dropout_keep_mask(ex.rng_state.view(torch.int64), p, 2, 3, 65, 70)
    assert 0.6 < keep.float().mean() < 0.9
    ref_kwargs = dict(dropout_mask=keep, dropout_p=p)
    leaves64 = [to64(t).requires_grad_() for t in (q, k, v)]
    ref_out, _ = attention_reference(*leaves64, **ref_kwargs)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    low_out, _ = attention_reference(*leaves, **ref_kwargs)
    assert_within_torch_error("out", out, ref_out.detach(), low_out.detach())
    dout = torch.randn_like(out)
    grads = ex.bwd(dout, q, k, v, out, lse, None, None, dropout_p=p)
    ref_grads = torch.autograd.grad((ref_out * dout.double()).sum(), leaves64)
    low_grads = torch.autograd.grad((low_out * dout).sum(), leaves)
    for name, got, want, low in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads):
        assert_within_torch_error(name, got, want, low, factor=3.0)


def test_backward_with_dropout_needs_the_forwards_state(sim_ops):
    q, k, v = sdpa_inputs("bshd_memory", torch.float16)
    out, lse = sim_ops._scaled_dot_product_flash_attention(q, k, v, 0.1)[:2]
    with pytest.raises(RuntimeError, match="needs the forward's rng_state"):
        sim_ops._scaled_dot_product_flash_attention_backward(
            out, q, k, v, out, lse, None, None, 33, 40, 0.1, False, torch.empty(0),
            torch.empty(0))


# ---- what flashattn cannot compute is an error, never ATen's kernel ----

def test_unsupported_arguments_are_errors(sim_ops):
    q, k, v = sdpa_inputs("bshd_memory", torch.float16)
    with pytest.raises(RuntimeError, match="return_debug_mask=True is not supported"):
        sim_ops._scaled_dot_product_flash_attention(q, k, v, 0.1, False, True)
    qf, kf, vf = (t.transpose(1, 2) for t in (q, k, v))
    # block_table joined ATen's schema after torch 2.11 (the GPU box's torch, which we support):
    # where the schema lacks it, no caller can pass one.
    if "block_table" in [a.name for a in aten._flash_attention_forward.default._schema.arguments]:
        table = torch.zeros(2, 1, dtype=torch.int32)
        with pytest.raises(RuntimeError, match=r"block_table \(paged KV\) is not supported"):
            sim_ops._flash_attention_forward(qf, kf, vf, None, None, 33, 40, 0.0, False, False,
                                             block_table=table)
    with pytest.raises(RuntimeError, match=r"value's head dim \(32\) must equal query's \(64\)"):
        sim_ops._scaled_dot_product_flash_attention(q, k, v[..., :32])
    with pytest.raises(RuntimeError, match="alibi_slopes is inference-only here"):
        sim_ops._flash_attention_forward(qf.requires_grad_(), kf, vf, None, None, 33, 40, 0.0,
                                         False, False, alibi_slopes=torch.ones(4))
