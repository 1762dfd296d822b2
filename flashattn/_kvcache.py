"""flash_attn_with_kvcache: one decoding step over a KV cache, FlashAttention-2's signature.

The new keys and values are written into the cache in place, rotary embeddings applied on the
way, and the queries attend to everything the cache then holds, in one call of
torch.ops.flashattn.fwd_kvcache. Forward only."""
import numbers
import operator

import torch

from ._interface import _optional_real, _real, _window_pair


class _ForwardOnly(torch.autograd.Function):
    """The outputs of a call whose inputs require grad: differentiating them is an error, as
    the varlen function's cache arguments are. fwd_kvcache itself can have no autograd formula
    (torch.library refuses one for an op that writes its inputs), and autograd's fallback would
    let a backward through it give no gradient, with only a warning."""

    @staticmethod
    def forward(ctx, out, lse):
        return out.view_as(out), lse.view_as(lse)

    @staticmethod
    def backward(ctx, dout, dlse):
        raise RuntimeError("flashattn: flash_attn_with_kvcache is forward only (inference): its "
                           "outputs cannot be differentiated; train with flash_attn_func or "
                           "flash_attn_varlen_func")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            q_descale=None, k_descale=None, v_descale=None):
    """Attention of q over a KV cache, after appending k and v to it in place.

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim); or, with
            block_table, a paged cache (num_blocks, page_size, nheads_k, headdim) of any page
            size >= 1. Written in place when k and v are given.
        k, v: (batch, seqlen_new, nheads_k, headdim) or None: keys and values to append, at
            positions cache_seqlens[b] ... cache_seqlens[b] + seqlen_new - 1 of each sequence.
        rotary_cos, rotary_sin: (seqlen_rotary, rotary_dim / 2) in q's dtype, or None. Rotate
            the first rotary_dim dims of the new k at their positions, and of q: at
            cache_seqlens[b] + i when causal or local, else all at cache_seqlens[b]. Need k, v.
        cache_seqlens: int, or int32 (batch,): how many keys each sequence has in the cache
            before the append; None: the whole cache.
        cache_batch_idx: int32 (batch,): sequence b uses cache entry cache_batch_idx[b]
            (dense caches).
        cache_leftpad: int32 (batch,): keys before cache_leftpad[b] take no part (dense
            caches); causal, window and ALiBi count from there.
        block_table: int32 (batch, max_blocks_per_seq): sequence b's key j is row
            j % page_size of block block_table[b, j // page_size].
        softmax_scale, causal, window_size, softcap, alibi_slopes: as flash_attn_func. Causal
            and window align bottom-right to the sequence's length after the append.
        rotary_interleaved: rotate pairs (2i, 2i + 1) (GPT-J) when True, else (i, i + d/2)
            (GPT-NeoX).
        num_splits: split each sequence's keys into this many parts computed in parallel and
            merged exactly (1: no split; 0: chosen from the work and the threads / SMs). For a
            fixed value the result is bitwise reproducible; different values agree to rounding.
        return_softmax_lse: also return the LSE, (batch, nheads, seqlen_q) float32.
        q_descale, k_descale, v_descale: FA3's FP8 decode: with q, k_cache and v_cache (and k,
            v) all torch.float8_e4m3fn, float32 (batch, nheads_k) factors (None: 1) that the
            logits (q k^T) * q_descale * k_descale * softmax_scale and out (P v) * v_descale
            take, per sequence and kv head; out is then bfloat16. Row b of a descale is
            sequence b of q, also with cache_batch_idx (not cache entry cache_batch_idx[b]; as
            FA3 indexes them). Runs the sm_90a FP8 forward (H100 / H200,
            FLASHATTN_CUDA_HOPPER=1) at head dim 128, over a dense, paged (block_table), indexed
            (cache_batch_idx) or left-padded (cache_leftpad) cache, with num_splits as above; no
            rotary, and with a paged, indexed or left-padded cache no softcap, alibi_slopes or
            attn_mask.

    Returns:
        out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse).
    """
    fn = "flash_attn_with_kvcache"
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((q.shape[0],), int(cache_seqlens), dtype=torch.int32,
                                   device=q.device)
    left, right = _window_pair(fn, window_size)
    try:
        num_splits = operator.index(num_splits)
    except TypeError:
        raise TypeError(f"{fn}: num_splits must be an int, got {num_splits!r}") from None
    out, lse = torch.ops.flashattn.fwd_kvcache(
        q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, block_table=block_table,
        softmax_scale=_optional_real(fn, "softmax_scale", softmax_scale), causal=bool(causal),
        window_left=left, window_right=right, softcap=_real(fn, "softcap", softcap),
        rotary_interleaved=bool(rotary_interleaved), alibi_slopes=alibi_slopes,
        num_splits=num_splits, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if out.requires_grad:
        out, lse = _ForwardOnly.apply(out, lse)
    return (out, lse) if return_softmax_lse else out
