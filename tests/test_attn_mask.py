"""attn_mask: F.scaled_dot_product_attention's mask on every executor against the float64
reference, for every broadcast shape and both kinds, with the float mask's gradient; the tile
classes (hidden tiles skipped, open tiles unmasked, a lone True found); bad masks; opcheck and
torch.compile."""
import pytest
import torch
import torch.nn.functional as F

import flashattn
from checks import make_qkv, to64
from executors import EXECUTORS, make_executor
from flashattn._reference import attention_reference
from tolerance import assert_within_torch_error

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BATCH, HEADS, HEADS_KV = 2, 4, 2

# Shapes that broadcast to (batch, heads, seqlen_q, seqlen_k); "S" is seqlen_q, "K" seqlen_k.
SHAPES = {
    "full": ("B", "H", "S", "K"),
    "2d": ("S", "K"),
    "key_padding": ("B", 1, 1, "K"),
    "per_head": (1, "H", "S", "K"),
    "per_query": ("B", 1, "S", 1),
    "3d": ("H", "S", "K"),
    "one": (1,),
}


def mask_shape(name, seqlen_q, seqlen_k):
    sizes = {"B": BATCH, "H": HEADS, "S": seqlen_q, "K": seqlen_k}
    return tuple(sizes.get(d, d) for d in SHAPES[name])


def make_mask(kind, shape, dtype, device, hidden=0.3):
    """A bool mask (True = take part) or a float one (random values, -inf where hidden)."""
    keep = torch.rand(shape, device=device) >= hidden
    if kind == "bool":
        return keep
    values = torch.randn(shape, device=device, dtype=dtype)
    return values.masked_fill(~keep, float("-inf"))


def check_masked(ex, q, k, v, mask, scale=0.3, backward=True, mask_grad=True):
    """ex with attn_mask against the float64 reference, forward and backward (with the float
    mask's gradient)."""
    out, lse = ex.fwd(q, k, v, scale, attn_mask=mask, align_bottom_right=False)
    mask64 = mask.cpu() if mask.dtype == torch.bool else to64(mask)  # to64: on the CPU too
    ref_kwargs = dict(softmax_scale=scale, align_bottom_right=False)
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), attn_mask=mask64,
                                           **ref_kwargs)
    low_mask = mask.cpu() if mask.dtype == torch.bool else mask.cpu().to(q.dtype)
    low_out, low_lse = attention_reference(q.cpu(), k.cpu(), v.cpu(), attn_mask=low_mask,
                                           **ref_kwargs)
    assert_within_torch_error("out", out.cpu(), ref_out, low_out)
    assert_within_torch_error("lse", lse.cpu(), ref_lse, low_lse.float())
    if not backward:
        return out, lse, None
    # A mask constant along the keys adds the same to a whole softmax row, which cancels: its
    # exact gradient is 0, and any kernel's is rounding noise that no tolerance rule bounds.
    want_dmask = mask_grad and mask.is_floating_point() and mask.shape[-1] != 1
    dout = torch.randn_like(out)
    grads = ex.bwd(dout, q, k, v, out, lse, None, scale, attn_mask=mask,
                   align_bottom_right=False, attn_mask_grad=want_dmask)

    def reference_grads(q, k, v, mask, dout):
        leaves = [t.detach().cpu().clone().requires_grad_() for t in (q, k, v)]
        mask_leaf = mask.detach().cpu().clone().requires_grad_(want_dmask)
        o, _ = attention_reference(*leaves, attn_mask=mask_leaf, **ref_kwargs)
        inputs = leaves + ([mask_leaf] if want_dmask else [])
        return torch.autograd.grad(o, inputs, dout.cpu().to(o.dtype))

    ref = reference_grads(to64(q), to64(k), to64(v), mask64, dout.double())
    low = reference_grads(q, k, v, low_mask, dout)
    names = ("dq", "dk", "dv", "dmask")[:len(ref)]
    for name, got, want, yardstick in zip(names, grads, ref, low):
        assert_within_torch_error(name, got.cpu(), want, yardstick, factor=3.0)
    if want_dmask:
        assert grads[3].shape == mask.shape and grads[3].dtype == mask.dtype
    return out, lse, grads


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_mask_matrix(executor, dtype, kind, shape):
    ex = make_executor(executor)
    seqlen_q, seqlen_k = 70, 129
    q, k, v = make_qkv(BATCH, seqlen_q, seqlen_k, HEADS, HEADS_KV, 32, dtype, ex.device)
    mask = make_mask(kind, mask_shape(shape, seqlen_q, seqlen_k), dtype, ex.device)
    check_masked(ex, q, k, v, mask)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("seqlens", [(1, 1), (7, 65), (65, 7), (63, 257), (257, 127)],
                         ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_mask_awkward_sizes(executor, seqlens):
    ex = make_executor(executor)
    q, k, v = make_qkv(BATCH, *seqlens, HEADS, HEADS_KV, 64, torch.float32, ex.device)
    check_masked(ex, q, k, v, make_mask("float", (BATCH, 1, *seqlens), torch.float32, ex.device))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_float32_mask_with_16bit_inputs(executor):
    ex = make_executor(executor)
    q, k, v = make_qkv(BATCH, 40, 90, HEADS, HEADS_KV, 32, torch.bfloat16, ex.device)
    check_masked(ex, q, k, v, make_mask("float", (1, HEADS, 40, 90), torch.float32, ex.device))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_structured_masks_skip_and_read_tiles(executor, kind):
    """Key padding and block-causal masks leave whole tiles hidden or open and a few to read;
    a lone kept key inside an otherwise hidden tile must still be found."""
    ex = make_executor(executor)
    seqlen = 300
    q, k, v = make_qkv(BATCH, seqlen, seqlen, HEADS, HEADS_KV, 32, torch.float32, ex.device)
    keys = torch.arange(seqlen, device=ex.device)
    lengths = torch.tensor([seqlen, 161], device=ex.device)
    key_padding = (keys[None, :] < lengths[:, None]).view(BATCH, 1, 1, seqlen)
    block_causal = (keys[:, None] // 64 >= keys[None, :] // 64)
    # Keys 0-63 at random, and one key deep inside tiles that are hidden but for it.
    lone = (torch.rand(seqlen, seqlen, device=ex.device) < 0.5) & (keys[None, :] < 64)
    lone[150, 290] = True
    for keep in (key_padding, block_causal, lone):
        mask = keep if kind == "bool" else torch.zeros(keep.shape, device=ex.device).masked_fill(
            ~keep, float("-inf"))
        check_masked(ex, q, k, v, mask)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fully_masked_rows_give_zero(executor):
    """Rows whose mask hides every key: out 0, lse -inf and zero gradients (torch >= 2.5)."""
    ex = make_executor(executor)
    q, k, v = make_qkv(BATCH, 50, 80, HEADS, HEADS_KV, 32, torch.float32, ex.device)
    keep = torch.rand(BATCH, 1, 50, 80, device=ex.device) > 0.4
    keep[:, :, 10:20] = False
    mask = torch.zeros(keep.shape, device=ex.device).masked_fill(~keep, float("-inf"))
    out, lse, (dq, _, _, dmask) = check_masked(ex, q, k, v, mask)
    assert torch.all(out[:, 10:20] == 0) and torch.all(dq[:, 10:20] == 0)
    assert torch.all(lse[:, :, 10:20] == float("-inf"))
    assert torch.all(dmask[:, :, 10:20] == 0)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_mask_with_window_alibi_softcap(executor):
    """The op takes attn_mask with every other feature: added after softcap and ALiBi."""
    ex = make_executor(executor)
    q, k, v = make_qkv(BATCH, 90, 110, HEADS, HEADS_KV, 32, torch.float32, ex.device)
    mask = make_mask("float", (BATCH, 1, 90, 110), torch.float32, ex.device)
    slopes = torch.rand(HEADS, device=ex.device)
    arguments = dict(causal=True, window=(40, -1), softcap=4.0, alibi_slopes=slopes)
    out, lse = ex.fwd(q, k, v, 0.3, attn_mask=mask, **arguments)
    ref_kwargs = dict(softmax_scale=0.3, causal=True, window_size=(40, -1), softcap=4.0,
                      alibi_slopes=slopes.cpu())
    ref_out, _ = attention_reference(to64(q), to64(k), to64(v), attn_mask=to64(mask),
                                     **ref_kwargs)
    low_out, _ = attention_reference(q.cpu(), k.cpu(), v.cpu(), attn_mask=mask.cpu(), **ref_kwargs)
    assert_within_torch_error("out", out.cpu(), ref_out, low_out)


# ---- the SDPA front end ----

@pytest.mark.parametrize("shape", ["2d", "key_padding", "full"])
def test_sdpa_front_end_matches_torch(shape):
    q = torch.randn(BATCH, HEADS, 33, 40)
    k, v = (torch.randn(BATCH, HEADS, 50, 40) for _ in range(2))
    for kind in ("bool", "float"):
        mask = make_mask(kind, mask_shape(shape, 33, 50), torch.float32, "cpu", hidden=0.2)
        ours = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        mask64 = mask if mask.dtype == torch.bool else mask.double()
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                              attn_mask=mask64)
        # Against float64, within 2x PyTorch's own float32 error (a flat 2e-6 against PyTorch's
        # float32 result failed now and then: both are ~1e-6 off, in different directions).
        assert_within_torch_error(f"{shape} {kind}", ours, want, theirs)


def test_sdpa_float_mask_gets_its_gradient_reduced():
    q, k, v = (torch.randn(BATCH, HEADS, 20, 16, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    mask = torch.randn(BATCH, 1, 1, 20, dtype=torch.float64, requires_grad=True)
    out = flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, mask))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v, mask))
    assert grads[3].shape == mask.shape
    # float64 agrees to ~1e-7 relative: the backward recomputes P from the float32 LSE, so
    # every term carries that relative error, and an entry that sums terms to near zero (the
    # mask's gradient, reduced over heads and queries) keeps the large terms' absolute error.
    # The bound is therefore relative to the gradient's largest entry: 1e-6 of it (measured
    # worst 2.4e-7 over 300 draws; a flat atol of 1e-6 failed 13 gradients in 1200).
    for got, want in zip(grads, ref_grads):
        scale = max(1.0, want.abs().max().item())
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * scale)


def test_gradcheck_float_mask():
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    mask = torch.randn(1, 2, 6, 6, dtype=torch.float64, requires_grad=True)

    def attend(q, k, v, mask):
        return flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    # The LSE the backward recomputes from is float32 by contract: loose tolerances.
    assert torch.autograd.gradcheck(attend, (q, k, v, mask), atol=1e-5, rtol=1e-4)


def test_mask_bad_input():
    q = torch.randn(BATCH, HEADS, 10, 16)
    k = torch.randn(BATCH, HEADS, 12, 16)
    with pytest.raises(ValueError, match=r"attn_mask and is_causal=True cannot be combined"):
        flashattn.scaled_dot_product_attention(q, k, k, attn_mask=torch.ones(10, 12, dtype=bool),
                                               is_causal=True)
    with pytest.raises(RuntimeError, match=r"attn_mask of shape \[10, 13\] does not broadcast "
                                           r"to the attention scores' shape \(batch, heads, "
                                           r"seqlen_q, seqlen_k\) = \[2, 4, 10, 12\]"):
        flashattn.scaled_dot_product_attention(q, k, k, attn_mask=torch.ones(10, 13, dtype=bool))
    with pytest.raises(RuntimeError, match=r"attn_mask must be bool, float32 or query's dtype "
                                           r"BFloat16, got Long"):
        flashattn.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), k.bfloat16(),
                                               attn_mask=torch.ones(10, 12, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"attn_mask is not supported with cu_seqlens_q"):
        cu = torch.tensor([0, 5], dtype=torch.int32)
        torch.ops.flashattn.fwd(q[0].transpose(0, 1)[:5], k[0].transpose(0, 1)[:5],
                                k[0].transpose(0, 1)[:5], cu_seqlens_q=cu, cu_seqlens_k=cu,
                                max_seqlen_q=5, max_seqlen_k=5,
                                attn_mask=torch.ones(5, 5, dtype=bool))


def test_bool_mask_has_no_gradient_to_ask_for():
    q, k, v = make_qkv(1, 5, 5, 1, 1, 8, torch.float32, "cpu")
    out, lse = torch.ops.flashattn.fwd(q, k, v, attn_mask=torch.ones(5, 5, dtype=bool))
    with pytest.raises(RuntimeError, match=r"attn_mask_grad needs a float attn_mask"):
        torch.ops.flashattn.bwd(dout=out, out=out, lse=lse, dlse=None, q=q, k=k, v=v,
                                attn_mask=torch.ones(5, 5, dtype=bool), attn_mask_grad=True)


def test_opcheck_with_masks():
    q, k, v = (t.requires_grad_() for t in make_qkv(BATCH, 9, 13, HEADS, HEADS_KV, 8,
                                                     torch.float32, "cpu"))
    for mask in (torch.rand(13) > 0.3, torch.randn(BATCH, 1, 9, 13, requires_grad=True)):
        torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v),
                              dict(attn_mask=mask, softmax_scale=0.4))
    # bwd is not differentiable (test_ops.py, double backward): checked on plain tensors.
    q, k, v, mask = (t.detach() for t in (q, k, v, mask))
    out, lse = torch.ops.flashattn.fwd(q, k, v, attn_mask=mask)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, (),
                          dict(dout=torch.randn_like(out), out=out, lse=lse, dlse=None, q=q, k=k,
                               v=v, attn_mask=mask, attn_mask_grad=True))


def test_compile_with_a_float_mask_and_its_gradient():
    torch._dynamo.reset()
    q, k, v = (torch.randn(BATCH, HEADS, 24, 16, requires_grad=True) for _ in range(3))
    mask = torch.randn(1, HEADS, 24, 24, requires_grad=True)

    def step(q, k, v, mask):
        return flashattn.scaled_dot_product_attention(q, k, v, attn_mask=mask).square().sum()

    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(q, k, v, mask)
    grads = torch.autograd.grad(loss, (q, k, v, mask))
    eager = step(q, k, v, mask)
    torch.testing.assert_close(loss, eager)
    for got, want in zip(grads, torch.autograd.grad(eager, (q, k, v, mask))):
        torch.testing.assert_close(got, want)


# ---- the CUDA kernels on the shim ----

@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


@pytest.mark.parametrize("dtype,head_dim", [(torch.float16, 64), (torch.bfloat16, 128),
                                            (torch.float32, 64), (torch.float16, 256)], ids=str)
@pytest.mark.parametrize("shape", ["full", "key_padding", "per_query"])
def test_sim_masks(sim, dtype, head_dim, shape):
    """Hidden, open and read tiles on the tensor-core and SIMT kernels, fwd and bwd (both dQ
    paths), with the mask's gradient."""
    q, k, v = make_qkv(BATCH, 70, 129, HEADS, HEADS_KV, head_dim, dtype, sim.device)
    mask = make_mask("float", mask_shape(shape, 70, 129), torch.float32, sim.device)
    check_masked(sim, q, k, v, mask)


def test_sim_structured_masks(sim):
    q, k, v = make_qkv(1, 200, 200, 2, 1, 64, torch.bfloat16, sim.device)
    keys = torch.arange(200)
    block_causal = keys[:, None] // 64 >= keys[None, :] // 64
    lone = (torch.rand(200, 200) < 0.5) & (keys[None, :] < 32)
    lone[100, 190] = True
    for keep in (block_causal, lone):
        check_masked(sim, q, k, v, keep)
