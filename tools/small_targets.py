"""Issue 29's targets, timed in pairs: flash_attn_func against F.scaled_dot_product_attention at
the issue's small shapes, forward and forward+backward, causal and not.

The two are timed in interleaved rounds (flashattn/bench/rounds.py, as `python -m flashattn.bench
small` times its calls): each round a block of calls of one library then a block of the other,
the order swapped every round (ABBA), and each round gives its own ratio t_sdpa / t_flashattn.
Reported: the median ratio, its interquartile range, and the median microseconds per call of
each.

    PYTHONPATH=. python tools/small_targets.py [--threads 1,2] [--rounds 101] [--json FILE]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import flashattn
from flashattn.bench import rounds

SHAPES = ((1, 1, 8, 64), (1, 16, 8, 64), (1, 128, 2, 32))  # (B, S, H, d), issue 29
TARGET = 0.9
# Calls per block: a block of ~0.5-2 ms, long against the clock's overhead, short against load.
CALLS = {"fwd": 100, "fwdbwd": 20}
WARMUP_CALLS = 50
US_PER_S = 1e6


def summarize(t_ours, t_theirs):
    """The per-round speedups t_theirs / t_ours: median and interquartile range, with each
    side's median microseconds per call."""
    ratios = rounds.round_ratios(t_theirs, t_ours)
    q1, median, q3 = rounds.quartiles(ratios)
    return {"ratio": median, "ratio_q1": q1, "ratio_q3": q3, "rounds": len(ratios),
            "flashattn_us": statistics.median(t_ours) * US_PER_S,
            "sdpa_us": statistics.median(t_theirs) * US_PER_S}


def steps(shape, causal, mode):
    """(flashattn step, SDPA step) on the same values: flash_attn_func on (B, S, H, d), SDPA
    on its (B, H, S, d) transposed views; forward+backward takes the three gradients."""
    q, k, v, dout = (torch.randn(shape) for _ in range(4))
    if mode == "fwd":
        qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
        return (lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
                lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal))
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.clone().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    dout_s = dout.transpose(1, 2)

    def fa():
        out = flashattn.flash_attn_func(*ours, causal=causal)
        return torch.autograd.grad(out, ours, dout)

    def sdpa():
        out = F.scaled_dot_product_attention(*theirs, is_causal=causal)
        return torch.autograd.grad(out, theirs, dout_s)
    return fa, sdpa


def agree(ours, theirs):
    """Raises unless the two steps give the same output (forward) or gradients (forward+
    backward) within fp32 rounding: a timing of a wrong result is no timing. SDPA's are in
    (B, H, S, d); a forward's single tensor is taken as a one-tuple."""
    a, b = ours(), theirs()
    a, b = (a,) if torch.is_tensor(a) else a, (b,) if torch.is_tensor(b) else b
    for x, y in zip(a, b):
        y = y.transpose(1, 2)
        if not torch.allclose(x, y, rtol=1e-3, atol=1e-4):
            raise AssertionError(f"flashattn and SDPA differ by {(x - y).abs().max().item():.3g}")


def measure(threads, round_count, seed=0):
    torch.set_num_threads(threads)
    rows = []
    for shape in SHAPES:
        for causal in (False, True):
            for mode in ("fwd", "fwdbwd"):
                torch.manual_seed(seed)
                ours, theirs = steps(shape, causal, mode)
                agree(ours, theirs)
                for _ in range(WARMUP_CALLS):
                    ours(), theirs()
                times = rounds.interleaved_rounds({"flashattn": ours, "sdpa": theirs},
                                                  round_count, CALLS[mode])
                row = summarize(times["flashattn"], times["sdpa"])
                rows.append({"shape": list(shape), "causal": causal, "mode": mode,
                             "threads": threads, **row})
    return rows


def line(row):
    held = "" if row["ratio"] >= TARGET else "  < %.1f" % TARGET
    return ("%-15s causal=%-5s %-6s threads=%d: %7.2f / %7.2f us  ratio %.3f [IQR %.3f-%.3f]%s"
            % (tuple(row["shape"]), row["causal"], row["mode"], row["threads"],
               row["flashattn_us"], row["sdpa_us"], row["ratio"], row["ratio_q1"],
               row["ratio_q3"], held))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="comma list (default 1,2)")
    parser.add_argument("--rounds", type=int, default=101, help="paired rounds per case")
    parser.add_argument("--json", metavar="FILE", help="also write the rows to FILE")
    args = parser.parse_args(argv)
    if args.rounds < 4:
        parser.error(f"--rounds: expected at least 4 (for quartiles), got {args.rounds}")
    print(f"flashattn {flashattn.__file__}, torch {torch.__version__}; ratio = t_sdpa / "
          f"t_flashattn per round, median [interquartile range]; {args.rounds} rounds",
          flush=True)
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        for row in measure(threads, args.rounds):
            print(line(row), flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
