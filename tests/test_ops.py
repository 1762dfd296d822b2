"""torch.library integration: opcheck on both ops, calls by argument name with the schema's
defaults, and torch.compile(fullgraph=True)."""
import pytest
import torch

import flashattn
from checks import make_qkv
from flashattn._reference import attention_reference


def fwd_samples():
    """(q, k, v) and the other forward arguments by name."""
    yield make_qkv(2, 9, 13, 4, 2, 8, torch.float32, "cpu"), dict(
        softmax_scale=0.3, causal=True)
    yield make_qkv(1, 16, 11, 2, 2, 16, torch.bfloat16, "cpu"), dict(
        softmax_scale=0.25, window_left=4, window_right=2, softcap=3.0,
        alibi_slopes=torch.rand(1, 2), align_bottom_right=False, deterministic=True)
    packed = torch.randn(2, 10, 3, 2, 8, dtype=torch.float64)
    yield packed.unbind(2), dict(causal=True, window_left=3, alibi_slopes=torch.rand(2))


@pytest.mark.parametrize("index", range(3))
def test_opcheck_fwd(index):
    (q, k, v), arguments = list(fwd_samples())[index]
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v), arguments)


@pytest.mark.parametrize("index", range(3))
def test_opcheck_bwd(index):
    (q, k, v), arguments = list(fwd_samples())[index]
    out, lse = torch.ops.flashattn.fwd(q, k, v, **arguments)
    grads = dict(dout=torch.randn_like(out), out=out, lse=lse, dlse=torch.randn_like(lse))
    torch.library.opcheck(torch.ops.flashattn.bwd.default, (),
                          dict(grads, q=q, k=k, v=v, **arguments))


def test_double_backward_is_an_error_not_zeros():
    """A gradient of flashattn's gradients (create_graph=True, then differentiate again) raises
    a clear error: autograd's fallback for an op without a formula would give zeros. The first
    gradient, taken with create_graph=True, is still right."""
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 7, 9, 2, 1, 8, torch.float64, "cpu"))
    dq, = torch.autograd.grad(flashattn.flash_attn_func(q, k, v, causal=True).sum(), q,
                              create_graph=True)
    reference = torch.autograd.grad(attention_reference(q, k, v, causal=True)[0].sum(), q)[0]
    # float64 gradients are recomputed from the float32 LSE (README, Limitations): P carries its
    # rounding, ~1e-7 relative, which assert_close's float64 default (1e-7) flagged in 3 of 300
    # random draws.
    torch.testing.assert_close(dq, reference, rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="flashattn: double backward is not supported"):
        torch.autograd.grad(dq.square().sum(), q)


def test_schema_defaults_are_flash_attn_funcs():
    """Every argument but q, k, v has a default, and the defaults are FA2's: calling the op with
    q, k, v alone is flash_attn_func(q, k, v)."""
    q, k, v = make_qkv(1, 21, 30, 2, 1, 16, torch.float32, "cpu")
    out, lse = torch.ops.flashattn.fwd(q, k, v)
    assert torch.equal(out, flashattn.flash_attn_func(q, k, v))
    for op in (torch.ops.flashattn.fwd, torch.ops.flashattn.bwd):
        required = [a.name for a in op.default._schema.arguments if not a.has_default_value()]
        assert required == (["q", "k", "v"] if op is torch.ops.flashattn.fwd
                            else ["dout", "out", "lse", "dlse", "q", "k", "v"])


def test_bwd_takes_the_forward_arguments_by_the_same_names():
    """bwd(dout, out, lse, dlse, <every forward argument>, attn_mask_grad, grads_fp32)."""
    def described(op):
        return [(a.name, str(a.type), a.default_value) for a in op.default._schema.arguments]

    fwd_args, bwd_args = described(torch.ops.flashattn.fwd), described(torch.ops.flashattn.bwd)
    assert bwd_args[4:4 + len(fwd_args)] == fwd_args
    assert [name for name, _, _ in bwd_args[4 + len(fwd_args):]] == ["attn_mask_grad",
                                                                     "grads_fp32"]


def test_unknown_argument_name_is_an_error():
    q, k, v = make_qkv(1, 5, 5, 1, 1, 4, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="Unknown keyword argument .window. for operator"):
        torch.ops.flashattn.fwd(q, k, v, window=(1, 1))


def test_torch_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 37, 41, 4, 2, 16, torch.float32, "cpu"))

    def step(q, k, v):
        out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(8, -1),
                                                return_attn_probs=True)
        sdpa = flashattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                      v.transpose(1, 2), is_causal=True,
                                                      enable_gqa=True)
        return (out.square().sum() + sdpa.sum() + torch.where(lse.isfinite(), lse, 0).sum())

    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    eager_loss = step(q, k, v)
    eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
    torch.testing.assert_close(loss, eager_loss)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want)


def test_torch_ops_namespace():
    q, k, v = make_qkv(1, 5, 5, 1, 1, 4, torch.float32, "cpu")
    out, lse = torch.ops.flashattn.fwd(q, k, v, softmax_scale=0.5)
    assert out.shape == q.shape and lse.shape == (1, 1, 5)
