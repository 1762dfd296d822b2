"""Merging the partial results of attention over disjoint sets of keys, by their LSE.

If block i gives out_i and lse_i for the same query rows, attention over the union of the keys
is sum_i out_i * exp(lse_i - lse) with lse = log(sum_i exp(lse_i)). The running out stays in
float32 (float64 for float64 inputs), the ring's running LSE in float64, and each is rounded
once, at the end. A row
that has seen no key yet has lse -inf and out 0, and stays so (never NaN: the weights of two
-inf terms are taken against 0, not against -inf)."""
import torch


def accumulator_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_(out_acc, lse_acc, out, lse):
    """out_acc, lse_acc (in place) <- the merge of themselves with (out, lse).

    out (..., rows, heads, D) in any float dtype, lse (..., heads, rows) float32: the layouts of
    flashattn's ops, dense (B, S, H, D) / (B, H, S) or varlen (T, H, D) / (H, T)."""
    lse = lse.to(lse_acc.dtype)
    top = torch.maximum(lse_acc, lse)
    top = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    w_acc = torch.exp(lse_acc - top)
    w_new = torch.exp(lse - top)
    total = w_acc + w_new
    lse_acc.copy_(top + torch.log(total))
    seen = total != 0
    total = torch.where(seen, total, torch.ones_like(total))
    # (..., heads, rows) -> (..., rows, heads, 1), the layout of out.
    w_acc = (w_acc / total).transpose(-1, -2).unsqueeze(-1).to(out_acc.dtype)
    w_new = (w_new / total).transpose(-1, -2).unsqueeze(-1).to(out_acc.dtype)
    out_acc.mul_(w_acc).add_(out.to(out_acc.dtype) * w_new)
