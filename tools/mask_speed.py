"""Issue 14's mask speed check: flashattn.scaled_dot_product_attention with a key-padding mask
and with a block-causal mask, against unmasked calls doing the same visible work, timed in
alternation in one process (medians of paired ratios). Prints one line per case.

    python tools/mask_speed.py [--seqlen 2048] [--heads 8] [--head-dim 64] [--repeats 9]
"""
import argparse
import statistics
import time

import torch

import flashattn


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired_ratio(masked, unmasked, repeats):
    """Median over repeats of t_masked / t_unmasked, the two called back to back."""
    masked(), unmasked()  # warm-up
    ratios = []
    for r in range(repeats):
        if r % 2:
            t_u, t_m = timed(unmasked), timed(masked)
        else:
            t_m, t_u = timed(masked), timed(unmasked)
        ratios.append(t_m / t_u)
    return statistics.median(ratios), min(ratios), max(ratios)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=4, help="block-causal: diagonal blocks")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    n, h, d, nb = args.seqlen, args.heads, args.head_dim, args.blocks
    torch.manual_seed(0)
    sdpa = flashattn.scaled_dot_product_attention

    def make(sq, sk, grad):
        q = torch.randn(1, h, sq, d, requires_grad=grad)
        k = torch.randn(1, h, sk, d, requires_grad=grad)
        v = torch.randn(1, h, sk, d, requires_grad=grad)
        return q, k, v

    for mode in ("forward", "forward+backward"):
        grad = mode != "forward"

        def run(q, k, v, **kw):
            out = sdpa(q, k, v, **kw)
            if grad:
                out.sum().backward()

        # Key padding: the last quarter of the keys masked, against those keys left out.
        kept = n - n // 4
        q, k, v = make(n, n, grad)
        pad = torch.zeros(1, 1, 1, n, dtype=torch.bool)
        pad[..., :kept] = True
        q2, k2, v2 = make(n, kept, grad)
        med, lo, hi = paired_ratio(lambda: run(q, k, v, attn_mask=pad),
                                   lambda: run(q2, k2, v2), args.repeats)
        print(f"{mode:17s} key padding ({kept} of {n} keys): masked / unmasked same work = "
              f"{med:.2f}x (range {lo:.2f}-{hi:.2f})", flush=True)

        # Block-causal: query block i sees key blocks 0..i; against one unmasked call per
        # query block over exactly those keys.
        size = n // nb
        block = torch.arange(n) // size
        mask = (block[None, :] <= block[:, None])  # (Sq, Sk), broadcast over batch and heads
        pieces = [make(size, (i + 1) * size, grad) for i in range(nb)]
        med, lo, hi = paired_ratio(lambda: run(q, k, v, attn_mask=mask),
                                   lambda: [run(*p) for p in pieces], args.repeats)
        print(f"{mode:17s} block-causal ({nb} blocks of {size}): masked / unmasked same work = "
              f"{med:.2f}x (range {lo:.2f}-{hi:.2f})", flush=True)


if __name__ == "__main__":
    main()
