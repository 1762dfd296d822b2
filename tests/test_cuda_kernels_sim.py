"""The CUDA kernels' own source, run on the CPU shim (torch.ops.flashattn_sim), against the
float64 reference.

Small sizes only: every CUDA thread is a fiber. The first run builds the extension
(tests/sim_ext/build.py, a few minutes on 2 cores); later runs reuse torch's build cache.
"""
import importlib.util
import math
import os

# Poisoned outputs (NaN) expose any element a kernel forgets; read once, when the library
# loads, so set it before the build/load below.
os.environ.setdefault("FLASHATTN_POISON_OUTPUTS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tolerance import assert_within_torch_error  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# By path: the sim build and the reference come from this source tree, and importing the
# flashattn package would need its compiled _C.
attention_reference = _load_by_path(
    "flashattn_reference", os.path.join(REPO, "flashattn", "reference.py")).attention_reference


@pytest.fixture(scope="module")
def sim():
    _load_by_path("sim_ext_build", os.path.join(TESTS, "sim_ext", "build.py")).load()
    return torch.ops.flashattn_sim


@pytest.fixture(params=["forward", "reverse", "random:20261129"])
def schedule(request, sim):
    """The order the shim runs warps in between barriers; a missing barrier changes results."""
    sim.set_schedule(request.param)
    yield request.param
    sim.set_schedule("forward")


HALF_TYPES = [torch.float16, torch.bfloat16]
# One head dim per compiled tile (32, 64, 96, 128, 192, 256), most of them padded.
HEAD_DIM_PER_TILE = [24, 64, 80, 128, 136, 256]


def make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype):
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype)
    return q, k, v


def check_fwd(sim, q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
              align_bottom_right=True, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, lse = sim.fwd(q, k, v, scale, causal, window[0], window[1], softcap, alibi,
                       align_bottom_right, False)
    mask = dict(softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                alibi_slopes=alibi, align_bottom_right=align_bottom_right)
    out64, lse64 = attention_reference(q.double(), k.double(), v.double(),
                                       **{**mask, "alibi_slopes": None if alibi is None
                                          else alibi.double()})
    out_lowp, lse_lowp = attention_reference(q, k, v, **mask)
    assert_within_torch_error("out", out, out64, out_lowp)
    assert_within_torch_error("lse", lse, lse64, lse_lowp.float())
    return out, lse


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIM_PER_TILE)
def test_fwd_every_head_dim_tile(sim, dtype, head_dim):
    check_fwd(sim, *make_qkv(2, 65, 129, 2, 1, head_dim, dtype))


MASKS = {
    "none": {},
    "causal": dict(causal=True),
    "window": dict(window=(9, 4)),
    "window_left": dict(window=(5, -1)),
    "window_right": dict(window=(-1, 3)),
    "window_causal": dict(causal=True, window=(17, -1)),
    "softcap": dict(softcap=3.0),
    "softcap_causal": dict(softcap=3.0, causal=True),
    "alibi": dict(alibi="head"),
    "alibi_batch_causal": dict(alibi="batch", causal=True),
    "top_left_causal": dict(causal=True, align_bottom_right=False),
    "top_left_window_alibi": dict(window=(6, 2), alibi="head", align_bottom_right=False),
    "negative_scale": dict(scale=-0.2),
}


def mask_options(mask, batch, heads):
    options = dict(MASKS[mask])
    if options.get("alibi") == "head":
        options["alibi"] = torch.rand(heads)
    elif options.get("alibi") == "batch":
        options["alibi"] = torch.rand(batch, heads)
    return options


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("seqlens", [(7, 65), (65, 7), (129, 129)], ids=str)
def test_fwd_mask_features(sim, mask, seqlens):
    batch, heads = 2, 3
    options = mask_options(mask, batch, heads)
    dtype = torch.bfloat16 if "alibi" in mask else torch.float16
    check_fwd(sim, *make_qkv(batch, *seqlens, heads, heads, 64, dtype), **options)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q", [1, 7, 65, 129])
@pytest.mark.parametrize("seqlen_k", [1, 7, 65, 129])
def test_fwd_tails(sim, seqlen_q, seqlen_k, causal):
    check_fwd(sim, *make_qkv(1, seqlen_q, seqlen_k, 2, 1, 32, torch.bfloat16), causal=causal)


@pytest.mark.parametrize("heads_kv", [1, 2, 3, 6])
def test_fwd_gqa(sim, heads_kv):
    check_fwd(sim, *make_qkv(2, 33, 47, 6, heads_kv, 64, torch.float16), causal=True)


@pytest.mark.parametrize("head_dim", [7, 13, 100])
def test_fwd_unaligned_head_dim(sim, head_dim):
    """Head dims that are not whole 16-byte chunks take the non-cp.async load path."""
    check_fwd(sim, *make_qkv(1, 40, 70, 2, 1, head_dim, torch.float16), window=(20, 5))


def test_fwd_strided_layouts(sim):
    # A slice of packed QKV (B, S, 3, H, D).
    q, k, v = torch.randn(2, 37, 3, 4, 64, dtype=torch.float16).unbind(2)
    check_fwd(sim, q, k, v, causal=True)
    # SDPA's (B, H, S, D) seen as (B, S, H, D).
    q, k, v = (torch.randn(2, 4, s, 64, dtype=torch.bfloat16).transpose(1, 2) for s in (37, 50, 50))
    check_fwd(sim, q, k, v)
    # A base pointer 2 bytes past a 16-byte boundary: rows are not cp.async-aligned.
    q, k, v = (torch.randn(1, s, 2, 65, dtype=torch.float16)[..., 1:] for s in (30, 45, 45))
    check_fwd(sim, q, k, v, causal=True)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_fwd_same_bits_under_every_schedule(sim, schedule, dtype):
    """Warp order between barriers must not matter: a missing __syncthreads or cp.async wait
    lets one warp see another's stale tile, and the result changes with the schedule."""
    torch.manual_seed(7)
    q, k, v = make_qkv(1, 130, 150, 2, 1, 128, dtype)
    out, lse = check_fwd(sim, q, k, v, causal=True, window=(40, -1))
    sim.set_schedule("forward")
    out_fwd, lse_fwd = sim.fwd(q, k, v, 1 / math.sqrt(128), True, 40, -1, 0.0, None, True, False)
    assert torch.equal(out, out_fwd) and torch.equal(lse, lse_fwd), schedule


def test_fwd_rows_that_see_nothing(sim):
    # Causal top-left with Sq > Sk aligned bottom-right: the first Sq - Sk rows see no key.
    q, k, v = make_qkv(1, 70, 10, 2, 2, 64, torch.float16)
    out, lse = check_fwd(sim, q, k, v, causal=True)
    assert torch.all(out[:, :60] == 0) and torch.all(lse[:, :, :60] == float("-inf"))


@pytest.mark.parametrize("shape", [(0, 5, 3), (2, 0, 3), (2, 5, 0)], ids=str)
def test_fwd_empty(sim, shape):
    batch, seqlen_q, seqlen_k = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 2, 2, 32, torch.float16)
    out, lse = sim.fwd(q, k, v, 0.5, False, -1, -1, 0.0, None, True, False)
    assert out.shape == q.shape and lse.shape == (batch, 2, seqlen_q)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


# fp32 runs on the SIMT kernels: one head dim per fp32 tile (64, 128, 256).
FP32_HEAD_DIMS = [24, 100, 256]
FP32_MASKS = ["none", "causal", "window", "softcap_causal", "alibi_batch_causal",
              "top_left_window_alibi"]


@pytest.mark.parametrize("head_dim", FP32_HEAD_DIMS)
@pytest.mark.parametrize("mask", FP32_MASKS)
def test_fwd_fp32(sim, head_dim, mask):
    check_fwd(sim, *make_qkv(1, 40, 70, 2, 1, head_dim, torch.float32),
              **mask_options(mask, 1, 2))


def test_schemas_match_flashattn(sim):
    try:
        import flashattn  # noqa: F401  loads _C, which registers torch.ops.flashattn
    except ImportError as error:  # a source tree without a built _C
        pytest.skip(f"flashattn is not built here: {error}")
    for name in ("fwd", "bwd"):
        ours = str(getattr(sim, name).default._schema).replace("flashattn_sim::", "")
        theirs = str(getattr(torch.ops.flashattn, name).default._schema).replace("flashattn::", "")
        assert ours == theirs


# ---- backward ----

def reference_grads(q, k, v, dout, dlse, dtype, mask):
    """(dq, dk, dv) of sum(out * dout) + sum(lse * dlse) through the reference in `dtype`."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    alibi = mask.get("alibi_slopes")
    options = {**mask, "alibi_slopes": None if alibi is None else alibi.to(
        torch.float64 if dtype == torch.float64 else torch.float32)}
    out, lse = attention_reference(*leaves, **options)
    loss = (out * dout.to(dtype)).sum()
    if dlse is not None:
        # Rows that see no key have lse = -inf and no gradient; leave them out of the loss.
        loss = loss + torch.where(torch.isfinite(lse), lse * dlse.to(lse.dtype), 0).sum()
    return torch.autograd.grad(loss, leaves)


def check_bwd(sim, q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
              align_bottom_right=True, scale=None, deterministic=False, with_dlse=False):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    args = (scale, causal, window[0], window[1], softcap, alibi, align_bottom_right)
    out, lse = sim.fwd(q, k, v, *args, False)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse) if with_dlse else None
    grads = sim.bwd(dout, q, k, v, out, lse, dlse, *args, deterministic)
    mask = dict(softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                alibi_slopes=alibi, align_bottom_right=align_bottom_right)
    grads64 = reference_grads(q, k, v, dout, dlse, torch.float64, mask)
    grads_lowp = reference_grads(q, k, v, dout, dlse, q.dtype, mask)
    for name, actual, ref64, lowp in zip(("dq", "dk", "dv"), grads, grads64, grads_lowp):
        assert_within_torch_error(name, actual, ref64, lowp, factor=3.0)
    return (out, lse, dout, dlse), grads


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIM_PER_TILE)
def test_bwd_every_head_dim_tile(sim, dtype, head_dim):
    check_bwd(sim, *make_qkv(2, 65, 129, 2, 1, head_dim, dtype), causal=True)


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("seqlens", [(7, 65), (65, 7), (129, 129)], ids=str)
def test_bwd_mask_features(sim, mask, seqlens):
    batch, heads = 2, 2
    options = mask_options(mask, batch, heads)
    dtype = torch.bfloat16 if "alibi" in mask else torch.float16
    check_bwd(sim, *make_qkv(batch, *seqlens, heads, heads, 64, dtype), **options)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q", [1, 7, 65, 129])
@pytest.mark.parametrize("seqlen_k", [1, 7, 65, 129])
def test_bwd_tails(sim, seqlen_q, seqlen_k, causal):
    check_bwd(sim, *make_qkv(1, seqlen_q, seqlen_k, 2, 1, 32, torch.float16), causal=causal)


@pytest.mark.parametrize("heads_kv", [1, 2, 3, 6])
@pytest.mark.parametrize("deterministic", [False, True])
def test_bwd_gqa_and_dlse(sim, heads_kv, deterministic):
    check_bwd(sim, *make_qkv(2, 33, 47, 6, heads_kv, 64, torch.bfloat16), causal=True,
              deterministic=deterministic, with_dlse=True)


@pytest.mark.parametrize("head_dim", [7, 100, 200])
def test_bwd_unaligned_head_dim(sim, head_dim):
    check_bwd(sim, *make_qkv(1, 40, 70, 2, 1, head_dim, torch.float16), window=(20, 5),
              softcap=5.0)


def test_bwd_strided_layouts(sim):
    q, k, v = torch.randn(2, 37, 3, 4, 64, dtype=torch.float16).unbind(2)
    check_bwd(sim, q, k, v, causal=True)
    q, k, v = (torch.randn(1, s, 2, 65, dtype=torch.bfloat16)[..., 1:] for s in (30, 45, 45))
    check_bwd(sim, q, k, v, causal=True, deterministic=True)


@pytest.mark.parametrize("head_dim", [64, 192])
def test_bwd_deterministic_same_bits_under_every_schedule(sim, schedule, head_dim):
    """deterministic=True must give the same bits every run and under any warp order; the
    default (atomic dQ) must be correct under any warp order."""
    torch.manual_seed(11)
    q, k, v = make_qkv(1, 97, 80, 4, 2, head_dim, torch.bfloat16)
    (out, lse, dout, dlse), grads = check_bwd(sim, q, k, v, causal=True, deterministic=True,
                                              with_dlse=True)
    sim.set_schedule("forward")
    again = sim.bwd(dout, q, k, v, out, lse, dlse, 1 / math.sqrt(head_dim), True, -1, -1, 0.0,
                    None, True, True)
    assert all(torch.equal(a, b) for a, b in zip(grads, again)), schedule
    sim.set_schedule(schedule)
    check_bwd(sim, q, k, v, causal=True, deterministic=False)


def test_bwd_rows_that_see_nothing(sim):
    q, k, v = make_qkv(1, 70, 10, 2, 2, 64, torch.float16)
    _, (dq, dk, dv) = check_bwd(sim, q, k, v, causal=True, with_dlse=True)
    assert torch.all(dq[:, :60] == 0)


@pytest.mark.parametrize("shape", [(0, 5, 3, 2), (2, 0, 3, 2), (2, 5, 0, 2), (2, 5, 3, 0)],
                         ids=str)
@pytest.mark.parametrize("deterministic", [False, True])
def test_bwd_empty(sim, shape, deterministic):
    batch, seqlen_q, seqlen_k, heads_q = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_q, 2, 32, torch.float16)
    out, lse = sim.fwd(q, k, v, 0.5, False, -1, -1, 0.0, None, True, False)
    grads = sim.bwd(torch.randn_like(out), q, k, v, out, lse, None, 0.5, False, -1, -1, 0.0,
                    None, True, deterministic)
    for grad, like in zip(grads, (q, k, v)):
        assert grad.shape == like.shape and torch.all(grad == 0)


@pytest.mark.parametrize("head_dim", FP32_HEAD_DIMS)
@pytest.mark.parametrize("mask", FP32_MASKS)
def test_bwd_fp32(sim, head_dim, mask):
    check_bwd(sim, *make_qkv(1, 40, 70, 2, 1, head_dim, torch.float32),
              with_dlse=True, **mask_options(mask, 1, 2))


@pytest.mark.parametrize("seqlens", [(1, 1), (7, 65), (65, 7), (0, 5), (5, 0)], ids=str)
def test_fp32_tails_and_strides(sim, seqlens):
    q, k, v = (torch.randn(1, s, 3, 2, 33, dtype=torch.float32)[:, :, 1]
               for s in (seqlens[0], seqlens[1], seqlens[1]))
    if 0 in seqlens:
        out, lse = sim.fwd(q, k, v, 0.3, True, -1, -1, 0.0, None, True, False)
        grads = sim.bwd(torch.randn_like(out), q, k, v, out, lse, None, 0.3, True, -1, -1, 0.0,
                        None, True, False)
        assert torch.all(out == 0) and all(torch.all(g == 0) for g in grads)
        return
    check_fwd(sim, q, k, v, causal=True)
    check_bwd(sim, q, k, v, causal=True)
