"""torch.library integration: opcheck on both ops and torch.compile(fullgraph=True)."""
import pytest
import torch

import flashattn
from test_forward import make_qkv


def fwd_samples():
    yield make_qkv(2, 9, 13, 4, 2, 8, torch.float32, "cpu"), (0.3, True, -1, -1, 0.0, None, True, False)
    yield make_qkv(1, 16, 11, 2, 2, 16, torch.bfloat16, "cpu"), (0.25, False, 4, 2, 3.0, torch.rand(1, 2), False, True)
    packed = torch.randn(2, 10, 3, 2, 8, dtype=torch.float64)
    yield packed.unbind(2), (0.5, True, 3, -1, 0.0, torch.rand(2), True, False)


@pytest.mark.parametrize("index", range(3))
def test_opcheck_fwd(index):
    (q, k, v), args = list(fwd_samples())[index]
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, *args))


@pytest.mark.parametrize("index", range(3))
def test_opcheck_bwd(index):
    (q, k, v), args = list(fwd_samples())[index]
    scale, causal, left, right, softcap, alibi, bottom_right, deterministic = args
    out, lse = torch.ops.flashattn.fwd(q, k, v, *args)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (dout, q, k, v, out, lse, dlse, scale, causal, left, right, softcap,
                           alibi, bottom_right, deterministic))


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
    out, lse = torch.ops.flashattn.fwd(q, k, v, 0.5, False, -1, -1, 0.0, None, True, False)
    assert out.shape == q.shape and lse.shape == (1, 1, 5)
