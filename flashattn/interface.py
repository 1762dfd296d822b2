"""The two public entry points. Both are thin: they translate arguments and pass strided views
to torch.ops.flashattn.fwd, never copying a tensor and never falling back to another kernel."""
import math
import numbers

import torch

_SUPPORT = """
    Supported inputs:
      device  dtypes                          head_dim
      CPU     float32, float64, float16, bf16  any (16-bit inputs are computed in float32)
      CUDA    float16, bf16, float32           <= 256
    Any strides are accepted as long as the last (head_dim) dimension is contiguous.
"""


def _check_dropout(fn, dropout_p):
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"{fn}: dropout_p > 0 is not supported yet (got dropout_p={dropout_p}); "
            f"use dropout_p=0.0")


def _default_scale(scale, head_dim):
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _window_pair(window_size):
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, numbers.Integral) for w in window_size)):
        raise ValueError(
            f"flash_attn_func: window_size must be a pair of ints (left, right), -1 meaning "
            f"unbounded, got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """Exact softmax attention, FlashAttention-2's ``flash_attn_func`` signature.

    Args:
        q: (batch, seqlen_q, nheads, headdim)
        k: (batch, seqlen_k, nheads_k, headdim); nheads must be a multiple of nheads_k (GQA/MQA)
        v: (batch, seqlen_k, nheads_k, headdim)
        dropout_p: must be 0.0 (dropout is not implemented; anything else raises).
        softmax_scale: scale of q·k, default 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner as in FlashAttention-2.
            Query i sees key j iff j <= i + seqlen_k - seqlen_q. For seqlen_q=2, seqlen_k=5
            (1 = kept, 0 = masked)::

                1 1 1 1 0
                1 1 1 1 1

            and for seqlen_q=5, seqlen_k=2 the first three rows see nothing (their output
            is 0, their LSE -inf)::

                0 0
                0 0
                0 0
                1 0
                1 1

        window_size: (left, right). Query i sees keys in
            [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]; -1 = unbounded.
        softcap: if > 0, scores become softcap * tanh(scores / softcap) (after scaling).
        alibi_slopes: float32 (nheads,) or (batch, nheads); adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score.
        deterministic: make the backward pass bitwise reproducible (the CPU backward always is).
        return_attn_probs: also return the log-sum-exp of each row.

    Returns:
        out: (batch, seqlen_q, nheads, headdim), dtype of q. If return_attn_probs, the tuple
        (out, softmax_lse, None): softmax_lse is (batch, nheads, seqlen_q) float32 and
        differentiable; the third slot (FA2's dropout mask) is always None here.
    """
    _check_dropout("flash_attn_func", dropout_p)
    left, right = _window_pair(window_size)
    scale = _default_scale(softmax_scale, q.shape[-1])
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, bool(causal), left, right,
                                       float(softcap), alibi_slopes, True, bool(deterministic))
    return (out, lse, None) if return_attn_probs else out


def _check_sdpa_rank(name, t):
    if t.dim() != 4:
        raise ValueError(
            f"scaled_dot_product_attention: {name} must be 4-D (batch, heads, seqlen, head_dim), "
            f"got {t.dim()}-D with shape {tuple(t.shape)}")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """Exact softmax attention with ``torch.nn.functional.scaled_dot_product_attention``'s
    signature and semantics.

    Args:
        query: (batch, heads, seqlen_q, head_dim)
        key:   (batch, heads_kv, seqlen_k, head_dim)
        value: (batch, heads_kv, seqlen_k, head_dim)
        attn_mask: must be None (arbitrary masks are not supported; use is_causal).
        dropout_p: must be 0.0.
        is_causal: causal mask aligned to the top-left corner, like F.sdpa
            (``torch.ones(L, S).tril()``): query i sees key j iff j <= i. For L=2, S=5::

                1 0 0 0 0
                1 1 0 0 0

            (flash_attn_func aligns to the bottom-right instead.)
        scale: scale of q·k, default 1 / sqrt(head_dim).
        enable_gqa: allow heads to be a multiple of heads_kv; otherwise they must be equal.

    Returns:
        (batch, heads, seqlen_q, head_dim) in query's dtype: a transposed view of a
        (batch, seqlen_q, heads, head_dim) buffer, as SDPA's flash backend returns.
    """
    if attn_mask is not None:
        raise NotImplementedError(
            "scaled_dot_product_attention: attn_mask is not supported (got a tensor of shape "
            f"{tuple(attn_mask.shape)}); pass attn_mask=None, and is_causal=True for a causal mask")
    _check_dropout("scaled_dot_product_attention", dropout_p)
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_sdpa_rank(name, t)
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise ValueError(
            f"scaled_dot_product_attention: query has {query.shape[1]} heads but key has "
            f"{key.shape[1]}; pass enable_gqa=True for grouped-query attention")
    softmax_scale = _default_scale(scale, query.shape[-1])
    # (B, H, S, D) -> (B, S, H, D) is a stride permutation, not a copy.
    out, _ = torch.ops.flashattn.fwd(query.transpose(1, 2), key.transpose(1, 2),
                                     value.transpose(1, 2), softmax_scale, bool(is_causal), -1, -1,
                                     0.0, None, False, False)
    return out.transpose(1, 2)


flash_attn_func.__doc__ += _SUPPORT
scaled_dot_product_attention.__doc__ += _SUPPORT
