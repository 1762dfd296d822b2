"""`python -m flashattn.bench dense`, the main job and the subcommand run when none is named:
flashattn against torch.nn.functional.scaled_dot_product_attention on dense batches.

Runs on the best device present (CUDA, else CPU) and, for every SDPA backend that device has,
measures forward and forward+backward over a few sequence lengths: max error against a float64
reference, median time, TFLOP/s, flashattn's speedup and peak memory. Every implementation is
called on the same (batch, heads, seqlen, head_dim) tensors, and timed in alternation within one
process, so each speedup is a ratio of calls made back to back. The forward is also held against
the machine's matmul rate and, on the CPU, flashattn's own tile products (ceilings.py).
"""
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .. import __version__
from .._interface import scaled_dot_product_attention as flashattn_sdpa
from . import ceilings, measure, options, plot, sdpa, summary
from .common import FLOPS_PER_TFLOP, MODE_TITLES, NOT_AVAILABLE, attention_flops, dtype_name
from .table import Table, case_title, fmt, times

HELP = ("flashattn against every F.sdpa backend on dense batches: error, time, TFLOP/s, speedup, "
        "peak memory (the default)")
DESCRIPTION = ("Compare flashattn with every F.scaled_dot_product_attention backend of the "
               "device on dense batches: error against float64, median time, TFLOP/s, speedup, "
               "peak memory; the forward also against the machine's matmul rate and, on the "
               "CPU, flashattn's own tile products.")
EPILOG = ("Defaults depend on the device: CPU float32, batch 1, 8 heads of 64, seqlen 512-4096; "
          "CUDA bfloat16, 16 heads of 128, 16k tokens per batch, seqlen 1k-16k.")
PLOTS = "time and peak memory against seqlen"
FLASHATTN = ceilings.FLASHATTN


@dataclass(frozen=True)
class Settings:
    dtypes: tuple
    batch: Optional[int]             # None: tokens_per_batch // seqlen sequences per batch
    tokens_per_batch: Optional[int]
    heads: int
    head_dim: int
    seqlens: tuple
    repeats: int
    warmup: int

    def batch_for(self, seqlen):
        return self.batch if self.batch else max(1, self.tokens_per_batch // seqlen)


# CPU: a default run of a few minutes on two cores. CUDA: a 2048-wide model (16 heads of 128)
# at 16k tokens per batch, FlashAttention-2's benchmark setting. Warm-up is longer on CUDA,
# where first calls pay for autotuning and cuDNN graph building.
DEFAULTS = {
    "cpu": Settings(dtypes=(torch.float32,), batch=1, tokens_per_batch=None, heads=8,
                    head_dim=64, seqlens=(512, 1024, 2048, 4096), repeats=5, warmup=1),
    "cuda": Settings(dtypes=(torch.bfloat16,), batch=None, tokens_per_batch=16 * 1024, heads=16,
                     head_dim=128, seqlens=(1024, 2048, 4096, 8192, 16384), repeats=10,
                     warmup=3),
}
# --quick: small enough for CI, a few seconds in all.
QUICK = {
    "cpu": dict(heads=2, head_dim=32, seqlens=(128, 256)),
    "cuda": dict(batch=1, heads=4, head_dim=64, seqlens=(256, 512)),
}


def add_arguments(parser):
    parser.add_argument("--batch", type=options.positive_int, metavar="N",
                        help="default: cpu 1, cuda 16k tokens / seqlen")
    options.add_head_options(parser)
    parser.add_argument("--seqlens", type=options.int_list, metavar="LIST",
                        help="comma list, e.g. 512,1024")
    options.add_mode_options(parser)


@dataclass(frozen=True)
class Case:
    mode: str
    dtype: torch.dtype
    causal: bool
    seqlen: int
    batch: int
    heads: int
    head_dim: int

    def flops(self):
        return attention_flops(self.mode, self.causal, self.heads, self.head_dim,
                               [self.seqlen] * self.batch)

    def label(self):
        return (f"{self.mode} {dtype_name(self.dtype)} {'causal' if self.causal else 'non-causal'}"
                f" S={self.seqlen} B={self.batch}")


@dataclass
class Result:
    mode: str
    dtype: str
    causal: bool
    seqlen: int
    batch: int
    heads: int
    head_dim: int
    impl: str
    status: str = "ok"                # or NOT_AVAILABLE, with the reason
    reason: Optional[str] = None
    max_err: Optional[float] = None   # max |out - float64 reference| over the checked rows
    dq_err: Optional[float] = None    # same for dq, forward+backward only
    time_ms: Optional[float] = None   # median of times_ms
    times_ms: Optional[list] = None
    tflops: Optional[float] = None
    speedup: Optional[float] = None   # flashattn vs this: median over repeats of t_this / t_fa
    peak_mb: Optional[float] = None   # memory above the inputs at the peak of one call


@dataclass(frozen=True)
class Impl:
    name: str
    attend: Callable  # (q, k, v, causal) -> out, in the layout below
    # The layout the implementation is called in: "bhsd" (batch, heads, seqlen, head_dim), as
    # F.sdpa takes it, or "bshd", FlashAttention's: transposed views of the same tensors.
    layout: str = "bhsd"


def sdpa_implementations(device_type):
    return [Impl(name, lambda q, k, v, causal, sdpa=forced: sdpa(q, k, v, is_causal=causal))
            for name, forced in sdpa.forced_backends(device_type)]


def implementations(device_type):
    return [Impl(FLASHATTN, lambda q, k, v, causal: flashattn_sdpa(q, k, v, is_causal=causal)),
            *sdpa_implementations(device_type)]


def enumerate_cases(args, settings):
    return [Case(mode, dtype, causal, seqlen, settings.batch_for(seqlen), settings.heads,
                 settings.head_dim)
            for mode in options.modes(args) for dtype in settings.dtypes
            for causal in options.causal_flags(args) for seqlen in settings.seqlens]


def make_inputs(case, device):
    """Fresh random q, k, v (and dout for the backward): zeros would hide masking bugs."""
    shape = (case.batch, case.heads, case.seqlen, case.head_dim)
    with_grad = case.mode == "fwdbwd"
    q, k, v = (torch.randn(shape, dtype=case.dtype, device=device, requires_grad=with_grad)
               for _ in range(3))
    dout = torch.randn(shape, dtype=case.dtype, device=device) if with_grad else None
    return q, k, v, dout


def in_layout(tensor, layout):
    """A (B, H, S, D) tensor (or None) in the layout asked for, as a view; and, given the view,
    the (B, H, S, D) tensor back."""
    return tensor.transpose(1, 2) if layout == "bshd" and tensor is not None else tensor


def make_step(impl, case, q, k, v, dout):
    """One timed call: returns (out, grads or None) so the caller frees them after the clock.
    The views of another layout are made here, before the clock."""
    q, k, v, dout = (in_layout(t, impl.layout) for t in (q, k, v, dout))
    if case.mode == "fwd":
        return lambda: (impl.attend(q, k, v, case.causal), None)

    def forward_backward():
        out = impl.attend(q, k, v, case.causal)
        return out, torch.autograd.grad(out, (q, k, v), dout)
    return forward_backward


def measure_case(case, impls, run, settings, timing=None):
    """The case's Result of every implementation: checked against float64, then timed in
    alternation (or by timing: measure.check_then_time's), with flashattn's paired speedup
    over each of the others."""
    q, k, v, dout = make_inputs(case, run.device)
    references = measure.reference_rows(q, k, v, dout, case.causal,
                                        with_dq=case.mode == "fwdbwd")

    def check_in(layout):
        def check(out, grads):
            return (measure.max_error(in_layout(out, layout), references, "out"),
                    None if grads is None
                    else measure.max_error(in_layout(grads[0], layout), references, "dq"))
        return check

    candidates = [(impl.name,
                   Result(case.mode, dtype_name(case.dtype), case.causal, case.seqlen,
                          case.batch, case.heads, case.head_dim, impl.name),
                   make_step(impl, case, q, k, v, dout), check_in(impl.layout))
                  for impl in impls]
    results, samples = measure.check_then_time(candidates, run.probe, settings, NOT_AVAILABLE,
                                               timing=timing)
    for name, times_ms in samples.items():
        result = results[name]
        result.tflops = case.flops() / (result.time_ms / measure.MS_PER_S) / FLOPS_PER_TFLOP
        if FLASHATTN in samples and name != FLASHATTN:
            result.speedup = measure.paired_speedup(times_ms, samples[FLASHATTN])
    return list(results.values())


def measure_cases(run, cases, impls, settings, table, row, measure_one=measure_case):
    """Every case, its table printed as it goes (a header per mode and dtype; row(result) ->
    the cells of a result that ran): [Result]. measure_one: measure_case or one of its
    signature."""
    results, group = [], None
    run.progress.expect(len(cases))
    for case in cases:
        if (case.mode, case.dtype) != group:
            group = (case.mode, case.dtype)
            run.print(table.header(case_title(case.mode, dtype_name(case.dtype),
                                              case.heads, case.head_dim)))
        run.progress.step(case.label())
        for r in measure_one(case, impls, run, settings):
            leading = ["yes" if r.causal else "no", r.seqlen, r.batch, r.impl]
            run.print(table.not_available(leading, r.reason) if r.status == NOT_AVAILABLE
                      else table.row([*leading, *row(r)]))
            results.append(r)
    return results


def summarize(results):
    """Per (mode, dtype): geometric mean over cases of flashattn's speedup against the fastest
    SDPA backend of each case (the smallest of its speedups)."""
    per_group = summary.smallest_speedup_per_case(
        results, group=lambda r: (r.mode, r.dtype), case=lambda r: (r.causal, r.seqlen, r.batch),
        speedup=lambda r: r.speedup)
    return [{"mode": mode, "dtype": dtype, "cases": len(speedups),
             "geomean_speedup_vs_best_sdpa": summary.geomean(speedups)}
            for (mode, dtype), speedups in per_group.items()]


def summary_lines(entries, legend):
    lines = ["", legend]
    for s in entries:
        verdict = summary.geomean_text(s["geomean_speedup_vs_best_sdpa"], s["cases"])
        lines.append(f"{MODE_TITLES[s['mode']]:>16}, {s['dtype']}: flashattn vs the best SDPA "
                     f"backend: {verdict}")
        lines += ceilings.lines(s)
    return lines


TABLE = Table((("causal", 6), ("seqlen", 6), ("batch", 5), ("impl", 14), ("max_err", 8),
               ("dq_err", 8), ("time_ms", 10), ("TFLOP/s", 8), ("fa_speedup", 10),
               ("peak_MB", 9)), reason_width=70)
LEGEND = ("fa_speedup = t_sdpa / t_flashattn per back-to-back pair, median; > 1: flashattn is "
          "faster. peak_MB: memory above the inputs at the peak of one call.")


def table_cells(r):
    return [fmt(r.max_err, ".1e"), fmt(r.dq_err, ".1e"), fmt(r.time_ms, ".3f"),
            fmt(r.tflops, ".3g"), times(r.speedup), fmt(r.peak_mb, ".1f")]


def main(run):
    settings = run.settings(DEFAULTS, QUICK)
    run.print_headline("vs F.scaled_dot_product_attention", settings.repeats)
    results = measure_cases(run, enumerate_cases(run.args, settings),
                            implementations(run.device.type), settings, TABLE, table_cells)
    entries = summarize(results)
    if "fwd" in options.modes(run.args):
        ceilings.add_ceilings(entries, results, settings, run)
    run.print(*summary_lines(entries, LEGEND))

    run.write_report({
        "dtypes": [dtype_name(d) for d in settings.dtypes], "heads": settings.heads,
        "head_dim": settings.head_dim, "seqlens": list(settings.seqlens),
        "batch": settings.batch, "tokens_per_batch": settings.tokens_per_batch,
        "causal": run.args.causal, "mode": run.args.mode,
        "repeats": settings.repeats, "warmup": settings.warmup,
        "checked_rows_per_end": measure.CHECKED_ROWS_PER_END, **measure.memory_meta(run.probe),
    }, entries, results)
    # After the JSON, so that a plot that fails to save cannot lose the measurements.
    if run.args.plot:
        plot.plot_results(run.args.plot, results, title=(
            f"flashattn {__version__} vs torch {torch.__version__} SDPA on {run.device.type} "
            f"({run.probe.describe()}), heads={settings.heads}, head_dim={settings.head_dim}"))
    return 0
