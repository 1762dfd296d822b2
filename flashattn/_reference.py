"""Plain-PyTorch attention with every flashattn feature: the single source of truth that tests
and the benchmark compare against. It materializes the (seqlen_q, seqlen_k) score matrix, so use
it at test sizes only.

Call it with float64 inputs for the reference, or with low-precision inputs to measure how much
error PyTorch itself makes in that dtype (the yardstick of the test tolerance).
"""
import math

import torch


def visible_keys(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1), align_bottom_right=True,
                 device=None):
    """Boolean (seqlen_q, seqlen_k) mask: True where query i may attend to key j."""
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    diag = i + (seqlen_k - seqlen_q if align_bottom_right else 0)
    left, right = window_size
    if causal:
        right = 0
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= diag - left
    if right >= 0:
        keep &= j <= diag + right
    return keep


def attention_scores(q, k, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                     alibi_slopes=None, align_bottom_right=True, attn_mask=None):
    """The logits (B, Hq, Sq, Sk) in the dtype of q: scaled q·k, then softcap, ALiBi and
    attn_mask, and -inf where causal or the window hides the key. q (B, Sq, Hq, D), k
    (B, Sk, Hkv, D)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    group = heads // heads_kv if heads_kv else 1
    qh = q.transpose(1, 2)                                       # (B, Hq, Sq, D)
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)       # (B, Hq, Sk, D)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale      # (B, Hq, Sq, Sk)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        i = torch.arange(seqlen_q, device=q.device).unsqueeze(1)
        j = torch.arange(seqlen_k, device=q.device).unsqueeze(0)
        offset = seqlen_k - seqlen_q if align_bottom_right else 0
        distance = (i + offset - j).abs().to(scores.dtype)
        slopes = alibi_slopes.to(scores.dtype)
        slopes = slopes.view(1, heads, 1, 1) if slopes.dim() == 1 else slopes.view(batch, heads, 1, 1)
        scores = scores - slopes * distance
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(scores.dtype)
    keep = visible_keys(seqlen_q, seqlen_k, causal, window_size, align_bottom_right, q.device)
    return scores.masked_fill(~keep, float("-inf"))


def attention_reference(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, align_bottom_right=True, attn_mask=None,
                        dropout_mask=None, dropout_p=0.0):
    """Attention in the dtype of q (pass float64 tensors for the reference).

    q (B, Sq, Hq, D), k (B, Sk, Hkv, D) and v (B, Sk, Hkv, Dv), Dv any. attn_mask: broadcastable to (B, Hq, Sq, Sk), bool
    (True = take part) or float (added to the scores after softcap and ALiBi). dropout_mask:
    bool (B, Hq, Sq, Sk), True = kept; kept probabilities are scaled by 1 / (1 - dropout_p)
    before the product with v (the LSE is that of the full softmax). Returns
    (out (B, Sq, Hq, Dv), lse (B, Hq, Sq)). Rows that see no key give out 0 and lse -inf.
    Differentiable everywhere, including at fully masked rows (their gradients are 0), and in
    a float attn_mask.
    """
    heads, heads_kv, seqlen_k = q.shape[2], k.shape[2], k.shape[1]
    group = heads // heads_kv if heads_kv else 1
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)       # (B, Hq, Sk, D)
    scores = attention_scores(q, k, softmax_scale, causal, window_size, softcap, alibi_slopes,
                              align_bottom_right, attn_mask)
    # A max that is detached and made finite keeps fully masked rows free of NaN, values and
    # gradients alike: log(sum(exp(s - m))) + m is the LSE for any constant m.
    if seqlen_k > 0:
        row_max = scores.amax(dim=-1, keepdim=True).detach()
    else:  # no keys at all: every row sees nothing
        row_max = scores.new_full((*scores.shape[:-1], 1), float("-inf"))
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    row_sum = weights.sum(dim=-1, keepdim=True)
    seen = row_sum != 0  # a NaN sum (NaN inputs) counts as seen: NaN out and NaN lse
    safe_sum = torch.where(seen, row_sum, torch.ones_like(row_sum))
    probs = weights / safe_sum
    if dropout_mask is not None:
        keep_scale = 1.0 / (1.0 - dropout_p) if dropout_p < 1 else 0.0
        probs = probs * dropout_mask.to(probs.dtype) * keep_scale
    out = torch.matmul(probs, vh)                                # (B, Hq, Sq, D)
    lse = torch.where(seen, row_max + torch.log(safe_sum), torch.full_like(row_sum, float("-inf")))
    return out.transpose(1, 2), lse.squeeze(-1)
