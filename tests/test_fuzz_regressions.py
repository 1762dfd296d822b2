"""Minimal cases the fuzzers (test_fuzz_differential.py, test_fuzz_malformed.py) found, kept
as regression tests."""
import pytest
import torch

import flashattn


def test_s_dmask_with_dropout_and_no_keys():
    """return_attn_probs with dropout and seqlen_k = 0: S_dmask's row maximum reduced over an
    empty dim (IndexError from amax) instead of giving an empty (B, H, Sq, 0) S_dmask."""
    q = torch.randn(1, 3, 1, 8)
    kv = torch.randn(1, 0, 2, 1, 8)
    out, lse, s_dmask = flashattn.flash_attn_kvpacked_func(q, kv, dropout_p=0.1,
                                                            return_attn_probs=True)
    assert s_dmask.shape == (1, 1, 3, 0)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.all(lse == float("-inf"))


def test_sdpa_scale_error_names_scale():
    """flashattn.scaled_dot_product_attention(scale=<2-element tensor>) named FA2's
    softmax_scale instead of SDPA's scale."""
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(TypeError, match=r"scaled_dot_product_attention: scale must be a real"):
        flashattn.scaled_dot_product_attention(q, q, q, scale=torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("scale", [float("inf"), float("-inf"), float("nan")])
def test_sdpa_non_finite_scale_error_names_scale(scale):
    """The op's own check said "softmax_scale must be finite", FA2's name, to an SDPA caller."""
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: scale must be finite"):
        flashattn.scaled_dot_product_attention(q, q, q, scale=scale)
