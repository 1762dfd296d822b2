"""A causal flag or window bound that excludes no key from any row (causal with one query row,
bottom-right aligned: a decode step; a window wider than the sequence) is no mask: the kernels'
plan takes every tile it touches as fully visible (tiling.h, tile_visibility), so the flag costs
nothing past its argument and changes no bit. The calls with the bound, with the op given the
bound directly, and without it agree exactly, forward and backward (issue 29). And a bound that
excludes a single key still masks."""
import pytest
import torch

import flashattn
from checks import reference_grads, to64
from flashattn._reference import attention_reference
from tolerance import assert_within_torch_error

FWD = torch.ops.flashattn.fwd.default
DTYPES = [torch.float32, torch.bfloat16, torch.float64]


def _inputs(seqlen_q, seqlen_k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seqlen_q, 4, 32, generator=g).to(dtype)
    k, v = (torch.randn(2, seqlen_k, 2, 32, generator=g).to(dtype) for _ in range(2))
    dout = torch.randn(2, seqlen_q, 4, 32, generator=g).to(dtype)
    return q, k, v, dout


def _out_lse_grads(call, q, k, v, dout):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = call(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    return [out.detach(), lse.detach(), *grads]


def _flash(**kwargs):
    return lambda q, k, v: flashattn.flash_attn_func(q, k, v, return_attn_probs=True,
                                                     **kwargs)[:2]


def _op(causal=False, window=(-1, -1)):
    return lambda q, k, v: FWD(q, k, v, None, causal, window[0], window[1])


def _sdpa(**kwargs):
    def call(q, k, v):
        out = flashattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                     v.transpose(1, 2), enable_gqa=True,
                                                     **kwargs)
        return out.transpose(1, 2), torch.zeros(q.shape[0], q.shape[2], q.shape[1])
    return call


def _assert_same_bits(got, want):
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), f"{name} differs"


# (Sq, Sk, causal, window): none of them excludes a key from any row, bottom-right aligned.
NOOP_CASES = [(1, sk, True, (-1, -1)) for sk in (1, 7, 63, 65, 127, 129, 257)] + [
    (1, 65, True, (64, -1)),     # causal, and a window reaching the first key
    (5, 9, False, (8, 4)),       # Sq < Sk: left reaches key 0 from the last row, right the end
    (9, 5, False, (4, 8)),       # Sq > Sk
    (7, 7, False, (6, 6)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seqlen_q, seqlen_k, causal, window", NOOP_CASES)
def test_bounds_that_exclude_nothing_keep_the_bits(seqlen_q, seqlen_k, causal, window, dtype):
    q, k, v, dout = _inputs(seqlen_q, seqlen_k, dtype, seed=seqlen_q * 1000 + seqlen_k)
    unmasked = _out_lse_grads(_flash(), q, k, v, dout)
    with_bound = _out_lse_grads(_flash(causal=causal, window_size=window), q, k, v, dout)
    op_with_bound = _out_lse_grads(_op(causal, window), q, k, v, dout)
    _assert_same_bits(with_bound, unmasked)
    _assert_same_bits(op_with_bound, unmasked)


@pytest.mark.parametrize("seqlen_q", [1, 7])
def test_sdpa_causal_at_one_key_keeps_the_bits(seqlen_q):
    """F.sdpa's causal is top-left aligned: it excludes nothing only when there is one key."""
    q, k, v, dout = _inputs(seqlen_q, 1, torch.float32, seed=seqlen_q)
    got = _out_lse_grads(_sdpa(is_causal=True), q, k, v, dout)
    want = _out_lse_grads(_sdpa(), q, k, v, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got[:1] + got[2:], want[:1] + want[2:]):
        assert torch.equal(a, b), f"{name} differs"


# (Sq, Sk, causal, window, align_bottom_right): each excludes at least one key of some row.
# Top-left alignment reaches the front end through scaled_dot_product_attention (causal only).
MASKING_CASES = [
    (2, 2, True, (-1, -1), True),    # the first row does not see the second key
    (1, 9, False, (3, -1), True),    # one row, a left bound short of key 0
    (1, 9, True, (-1, -1), False),   # top-left: one row sees key 0 only
    (5, 9, False, (7, 4), True),     # left misses key 0 from the last row by one
    (9, 5, False, (4, 7), True),     # right misses the last key from the first row by one
    (7, 1, True, (-1, -1), True),    # Sq > Sk, causal: the top rows see nothing
]


@pytest.mark.parametrize("seqlen_q, seqlen_k, causal, window, bottom_right", MASKING_CASES)
def test_bounds_that_exclude_a_key_still_mask(seqlen_q, seqlen_k, causal, window, bottom_right):
    q, k, v, dout = _inputs(seqlen_q, seqlen_k, torch.float32, seed=7)
    call = (_flash(causal=causal, window_size=window) if bottom_right
            else _sdpa(is_causal=causal))
    got = _out_lse_grads(call, q, k, v, dout)
    kwargs = dict(causal=causal, window_size=window, align_bottom_right=bottom_right)
    ref_out, ref_lse = attention_reference(to64(q), to64(k), to64(v), **kwargs)
    low_out, low_lse = attention_reference(q, k, v, **kwargs)
    unmasked_out, _ = attention_reference(to64(q), to64(k), to64(v))
    assert (ref_out - unmasked_out).abs().max() > 1e-3, "the case must mask something"
    assert_within_torch_error("out", got[0], ref_out, low_out)
    if bottom_right:  # _sdpa returns no LSE
        assert_within_torch_error("lse", got[1], ref_lse, low_lse)
    ref = reference_grads(to64(q), to64(k), to64(v), dout.double(), None, kwargs)
    low = reference_grads(q, k, v, dout, None, kwargs)
    for name, g, want, yardstick in zip(("dq", "dk", "dv"), got[2:], ref, low):
        assert_within_torch_error(name, g, want, yardstick, factor=3.0)
