"""The third value FlashAttention-2's functions return with dropout and return_attn_probs=True:
S_dmask, (batch, heads, seqlen_q, seqlen_k) float32, the probabilities each row had before
normalisation by its final maximum, exp(logit - row max), negated where dropout dropped the entry
(FA2's tests decode it with normalize_flash_attn_S, its block size being at least seqlen_k).

It materialises (batch, heads, seqlen_q, seqlen_k): for tests and small shapes only. The drop
decisions are the kernels' own (torch.ops.flashattn.dropout_keep_mask)."""
import torch

from ._reference import attention_scores


def _unnormalized(scores):
    """exp(scores - row max); rows that see nothing are 0."""
    if scores.shape[-1] == 0:  # no keys: amax has nothing to reduce
        return scores.clone()
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    return torch.exp(scores - row_max)


def dropped_probs(q, k, rng_state, dropout_p, score_kwargs, sequences=None):
    """q (B, Sq, H, D) and k (B, Sk, Hkv, D), or with `sequences` (a list of (first query row,
    queries, first key row, keys) per sequence) varlen q (total_q, H, D) and k; score_kwargs:
    reference.attention_scores' mask arguments (alibi_slopes per sequence when (B, H))."""
    heads = q.shape[-2]
    if sequences is None:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        probs = _unnormalized(attention_scores(q.float(), k.float(), **score_kwargs))
    else:
        batch = len(sequences)
        seqlen_q = max((n for _, n, _, _ in sequences), default=0)
        seqlen_k = max((n for _, _, _, n in sequences), default=0)
        probs = q.new_zeros((batch, heads, seqlen_q, seqlen_k), dtype=torch.float32)
        slopes = score_kwargs.get("alibi_slopes")
        for b, (q0, lq, k0, lk) in enumerate(sequences):
            kwargs = dict(score_kwargs)
            if slopes is not None and slopes.dim() == 2:
                kwargs["alibi_slopes"] = slopes[b:b + 1]
            scores = attention_scores(q[q0:q0 + lq][None].float(), k[k0:k0 + lk][None].float(),
                                      **kwargs)
            probs[b, :, :lq, :lk] = _unnormalized(scores)[0]
    keep = torch.ops.flashattn.dropout_keep_mask(rng_state.cpu(), dropout_p, batch, heads,
                                                 seqlen_q, seqlen_k).to(probs.device)
    return torch.where(keep, probs, -probs)
