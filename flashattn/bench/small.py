"""`python -m flashattn.bench small`: what one call costs at small shapes, where the kernel's
work is a few microseconds and the cost of reaching it (argument checks, dispatch, allocation,
autograd) is most of the time: decoding-sized and short-sequence calls.

The dense subcommand's measurement (dense.py) at S 1, 16, 64 and 128, B 1 and 8, 8 heads of 64,
causal and not, forward and forward+backward: flashattn's flash_attn_func, called as
FlashAttention-2 users call it, on (B, S, H, D) views of the inputs, against every SDPA backend
of the device on the same tensors in (B, H, S, D). Each call is checked against float64 first,
then timed alone, the implementations in alternation; times in microseconds, flashattn's
speedup paired call by call, and per direction and dtype the geometric mean of its speedup over
the fastest SDPA backend of each shape.
"""
from dataclasses import dataclass

import torch

from .._interface import flash_attn_func
from . import dense, measure, options
from .common import dtype_name
from .table import Table, fmt, times

HELP = ("per-call cost at small shapes (S 1-128, B 1 and 8): flash_attn_func against every SDPA "
        "backend, in microseconds")
DESCRIPTION = ("What one call costs at small shapes, where reaching the kernel is most of the "
               "time: flashattn's flash_attn_func on (B, S, H, D) views against every "
               "F.scaled_dot_product_attention backend of the device, each checked against "
               "float64, then timed call by call in alternation.")
EPILOG = ("Defaults: S 1,16,64,128, B 1,8, 8 heads of 64, causal and not, forward and "
          "forward+backward; CPU float32, CUDA bfloat16. --quick: S 16,64 at B 1.")
PLOTS = None
US_PER_MS = 1e3


@dataclass(frozen=True)
class Settings:
    dtypes: tuple
    batches: tuple
    heads: int
    head_dim: int
    seqlens: tuple
    repeats: int
    warmup: int


# Calls of microseconds are noisy one by one: many repeats (cheap here) steady the medians.
DEFAULTS = {
    "cpu": Settings(dtypes=(torch.float32,), batches=(1, 8), heads=8, head_dim=64,
                    seqlens=(1, 16, 64, 128), repeats=51, warmup=5),
    "cuda": Settings(dtypes=(torch.bfloat16,), batches=(1, 8), heads=8, head_dim=64,
                     seqlens=(1, 16, 64, 128), repeats=51, warmup=5),
}
# --quick: a couple of shapes, seconds, for CI.
QUICK = {device: dict(batches=(1,), seqlens=(16, 64), repeats=11) for device in DEFAULTS}


def add_arguments(parser):
    parser.add_argument("--seqlens", type=options.int_list, metavar="LIST",
                        help="comma list (default 1,16,64,128)")
    parser.add_argument("--batch-sizes", type=options.int_list, dest="batches", metavar="LIST",
                        help="comma list (default 1,8)")
    options.add_mode_options(parser)


def implementations(device_type):
    return [dense.Impl(dense.FLASHATTN,
                       lambda q, k, v, causal: flash_attn_func(q, k, v, causal=causal),
                       layout="bshd"),
            *dense.sdpa_implementations(device_type)]


def enumerate_cases(args, settings):
    return [dense.Case(mode, dtype, causal, seqlen, batch, settings.heads, settings.head_dim)
            for mode in options.modes(args) for dtype in settings.dtypes
            for causal in options.causal_flags(args) for batch in settings.batches
            for seqlen in settings.seqlens]


TABLE = Table((("causal", 6), ("seqlen", 6), ("batch", 5), ("impl", 14), ("max_err", 8),
               ("dq_err", 8), ("time_us", 10), ("fa_speedup", 10), ("peak_MB", 9)),
              reason_width=70)
LEGEND = ("time_us: median of single calls; fa_speedup = t_sdpa / t_flashattn per back-to-back "
          "pair of calls, median; > 1: flashattn is faster.")


def table_cells(r):
    return [fmt(r.max_err, ".1e"), fmt(r.dq_err, ".1e"),
            fmt(None if r.time_ms is None else r.time_ms * US_PER_MS, ".1f"), times(r.speedup),
            fmt(r.peak_mb, ".1f")]


def main(run):
    settings = run.settings(DEFAULTS, QUICK)
    run.print_headline("per-call cost at small shapes vs F.scaled_dot_product_attention",
                       settings.repeats)
    results = dense.measure_cases(run, enumerate_cases(run.args, settings),
                                  implementations(run.device.type), settings, TABLE, table_cells)
    entries = dense.summarize(results)
    run.print(*dense.summary_lines(entries, LEGEND))
    run.write_report({
        "flashattn_call": "flash_attn_func(q, k, v, causal=...) on (B, S, H, D) views",
        "dtypes": [dtype_name(d) for d in settings.dtypes], "batches": list(settings.batches),
        "heads": settings.heads, "head_dim": settings.head_dim,
        "seqlens": list(settings.seqlens), "causal": run.args.causal, "mode": run.args.mode,
        "repeats": settings.repeats, "warmup": settings.warmup,
        "checked_rows_per_end": measure.CHECKED_ROWS_PER_END, **measure.memory_meta(run.probe),
    }, entries, results)
    return 0
