"""`python -m flashattn.bench`: flashattn against torch.nn.functional.scaled_dot_product_attention.

Runs on the best device present (CUDA, else CPU) and, for every SDPA backend that device has,
measures forward and forward+backward over a few sequence lengths: max error against a float64
reference, median time, TFLOP/s, flashattn's speedup and peak memory. Every implementation is
called on the same (batch, heads, seqlen, head_dim) tensors, and timed in alternation within one
process, so each speedup is a ratio of calls made back to back. `--help` lists the options.
"""
import argparse
import datetime
import math
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from .. import __version__
from . import common
from . import decode
from . import measure
from . import plot
from . import sdpa_impl as sdpa_impl_bench
from . import varlen
from .._interface import scaled_dot_product_attention as flashattn_sdpa

FLASHATTN = "flashattn"


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
# The largest square matmul whose rate is reported as the ceiling ("matmul ceiling" in the
# summary); smaller where the dtype is slow on the machine (see measure.matmul_tflops).
MATMUL_SIZE = {"cpu": 2048, "cuda": 8192}
QUICK_MATMUL_SIZE = 256
# CPU: seconds each of flashattn's own tile products is timed on a hot tile (the "tile
# products" ceiling; measure.cpu_tile_products_tflops).
TILE_PRODUCTS_SECONDS = 1.0
QUICK_TILE_PRODUCTS_SECONDS = 0.05

# --quick: small enough for CI, a few seconds in all.
QUICK = {
    "cpu": dict(heads=2, head_dim=32, seqlens=(128, 256)),
    "cuda": dict(batch=1, heads=4, head_dim=64, seqlens=(256, 512)),
}


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
        forward = (common.FWD_FLOPS_PER_QKD * self.batch * self.heads * self.seqlen ** 2
                   * self.head_dim)
        if self.causal:
            forward /= 2
        return forward * (1 + common.BWD_FLOPS_PER_FWD) if self.mode == "fwdbwd" else forward


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
    status: str = "ok"                # or common.NOT_AVAILABLE, with the reason
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
    attend: Callable  # (q, k, v, causal) -> out, all (batch, heads, seqlen, head_dim)


def implementations(device_type):
    impls = [Impl(FLASHATTN, lambda q, k, v, causal: flashattn_sdpa(q, k, v, is_causal=causal))]
    impls += [Impl(f"sdpa-{label}", _sdpa_forced_to(backend))
              for label, backend in common.SDPA_BACKENDS[device_type]]
    return impls


def _sdpa_forced_to(backend):
    def attend(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attend


def make_inputs(case, device):
    """Fresh random q, k, v (and dout for the backward): zeros would hide masking bugs."""
    shape = (case.batch, case.heads, case.seqlen, case.head_dim)
    with_grad = case.mode == "fwdbwd"
    q, k, v = (torch.randn(shape, dtype=case.dtype, device=device, requires_grad=with_grad)
               for _ in range(3))
    dout = torch.randn(shape, dtype=case.dtype, device=device) if with_grad else None
    return q, k, v, dout


def make_step(impl, case, q, k, v, dout):
    """One timed call: returns (out, grads or None) so the caller frees them after the clock."""
    if case.mode == "fwd":
        return lambda: (impl.attend(q, k, v, case.causal), None)

    def forward_backward():
        out = impl.attend(q, k, v, case.causal)
        return out, torch.autograd.grad(out, (q, k, v), dout)
    return forward_backward


def measure_case(case, impls, probe, settings, device):
    q, k, v, dout = make_inputs(case, device)
    references = measure.reference_rows(q, k, v, dout, case.causal,
                                        with_dq=case.mode == "fwdbwd")
    def check(out, grads):
        return (measure.max_error(out, references, "out"),
                None if grads is None else measure.max_error(grads[0], references, "dq"))

    candidates = [(impl.name,
                   Result(case.mode, common.dtype_name(case.dtype), case.causal, case.seqlen,
                          case.batch, case.heads, case.head_dim, impl.name),
                   make_step(impl, case, q, k, v, dout), check)
                  for impl in impls]
    results, times = measure.check_then_time(candidates, probe, settings, common.NOT_AVAILABLE)
    for name, samples in times.items():
        result = results[name]
        result.tflops = case.flops() / (result.time_ms / measure.MS_PER_S) / common.FLOPS_PER_TFLOP
        if FLASHATTN in times and name != FLASHATTN:
            result.speedup = measure.paired_speedup(samples, times[FLASHATTN])
    return list(results.values())


def summarize(results):
    """Per (mode, dtype): geometric mean over cases of flashattn's speedup against the fastest
    SDPA backend of each case (the smallest of its speedups)."""
    per_case = {}
    for r in results:
        per_case.setdefault((r.mode, r.dtype, r.causal, r.seqlen), []).append(r.speedup)
    per_group = {}
    for (mode, dtype, _, _), speedups in per_case.items():
        known = [s for s in speedups if s is not None]
        per_group.setdefault((mode, dtype), [])
        if known:
            per_group[(mode, dtype)].append(min(known))
    return [{"mode": mode, "dtype": dtype, "cases": len(s),
             "geomean_speedup_vs_best_sdpa":
                 math.exp(statistics.fmean(math.log(x) for x in s)) if s else None}
            for (mode, dtype), s in per_group.items()]


COLUMNS = (("causal", 6), ("seqlen", 6), ("batch", 5), ("impl", 14), ("max_err", 8),
           ("dq_err", 8), ("time_ms", 10), ("TFLOP/s", 8), ("fa_speedup", 10), ("peak_MB", 9))
REASON_WIDTH = 70


def table_row(r):
    cells = ["yes" if r.causal else "no", r.seqlen, r.batch, r.impl]
    if r.status == common.NOT_AVAILABLE:
        head = "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, COLUMNS))
        return f"{head}  {common.NOT_AVAILABLE}: {r.reason[:REASON_WIDTH]}"
    cells += [common.fmt(r.max_err, ".1e"), common.fmt(r.dq_err, ".1e"),
              common.fmt(r.time_ms, ".3f"),
              common.fmt(r.tflops, ".3g"), "-" if r.speedup is None else f"{r.speedup:.2f}x",
              common.fmt(r.peak_mb, ".1f")]
    return "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, COLUMNS))


def add_matmul_ceilings(summary, results, ceilings):
    """Adds to each dtype's forward summary the matmul rate and the share of it that flashattn's
    non-causal forward reaches (attention is two matmuls plus a softmax: the share is how little
    the softmax and the tiling cost)."""
    for s in summary:
        if s["mode"] != "fwd" or s["dtype"] not in ceilings:
            continue
        tflops, size = ceilings[s["dtype"]]
        shares = [r.tflops / tflops for r in results
                  if (r.impl, r.mode, r.dtype, r.causal) == (FLASHATTN, "fwd", s["dtype"], False)
                  and r.tflops is not None]
        s["matmul_size"] = size
        s["matmul_tflops"] = tflops
        s["noncausal_fwd_share_of_matmul"] = [min(shares), max(shares)] if shares else None


def add_tile_product_ceilings(summary, results, ceilings, head_dim):
    """Adds to each dtype's forward summary the rate of flashattn's own tile products on a hot
    tile (CPU: measure.cpu_tile_products_tflops) and the share of the one the dtype takes that
    its non-causal forward reaches: a ceiling the kernel can reach, unlike torch.mm's, which is
    another library's large matmul."""
    for s in summary:
        if s["mode"] != "fwd" or s["dtype"] not in ceilings:
            continue
        rates = ceilings[s["dtype"]]
        s["tile_head_dim"] = head_dim
        s["tile_products"] = [{"kernel": what, "tflops": tflops, "taken": taken}
                              for what, tflops, taken in rates]
        taken = [tflops for _, tflops, is_taken in rates if is_taken]
        shares = [r.tflops / taken[0] for r in results
                  if (r.impl, r.mode, r.dtype, r.causal) == (FLASHATTN, "fwd", s["dtype"], False)
                  and r.tflops is not None] if taken else []
        s["noncausal_fwd_share_of_tile_products"] = [min(shares), max(shares)] if shares else None


def _share_text(shares, of):
    if not shares:
        return "no non-causal forward in this run"
    span = f"{100 * shares[0]:.0f}%" + ("" if shares[0] == shares[1] else f"-{100 * shares[1]:.0f}%")
    return f"flashattn's non-causal forward reaches {span} of {of}"


def summary_lines(summary):
    lines = ["", "fa_speedup = t_sdpa / t_flashattn per back-to-back pair, median; > 1: "
                 "flashattn is faster. peak_MB: memory above the inputs at the peak of one call."]
    for s in summary:
        value = s["geomean_speedup_vs_best_sdpa"]
        verdict = (f"{value:.2f}x (geometric mean over {s['cases']} cases)" if value
                   else "n/a (flashattn or every SDPA backend could not run)")
        title = common.MODE_TITLES[s['mode']]
        lines.append(f"{title:>16}, {s['dtype']}: flashattn vs the best SDPA "
                     f"backend: {verdict}")
        if s.get("tile_products"):
            rates = ", ".join(f"{t['kernel']} {1e3 * t['tflops']:.3g} GFLOP/s"
                              f"{' (taken)' if t['taken'] else ''}" for t in s["tile_products"])
            lines.append(f"{'':>16}  tile-product ceiling (the forward's own Q·Kᵀ and P·V on a hot "
                         f"128x128 block, head_dim {s['tile_head_dim']}): {rates}; "
                         f"{_share_text(s['noncausal_fwd_share_of_tile_products'], 'the one taken')}")
        if s.get("matmul_tflops"):
            size, shares = s["matmul_size"], s["noncausal_fwd_share_of_matmul"]
            lines.append(f"{'':>16}  matmul ceiling ({size}x{size}x{size}, {s['dtype']}): "
                         f"{1e3 * s['matmul_tflops']:.3g} GFLOP/s (torch.mm); "
                         f"{_share_text(shares, 'it')}")
    return lines


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m flashattn.bench",
        description="Compare flashattn with every F.scaled_dot_product_attention backend of the "
                    "device: error against float64, median time, TFLOP/s, speedup, peak memory.",
        epilog="Defaults depend on the device: CPU float32, batch 1, 8 heads of 64, seqlen "
               "512-4096; CUDA bfloat16, 16 heads of 128, 16k tokens per batch, seqlen 1k-16k.")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available")
    p.add_argument("--dtype", type=common.dtype_list, dest="dtypes", metavar="LIST",
                   help="comma list: float32, bfloat16, float16, float64 (or fp32, bf16, ...)")
    p.add_argument("--batch", type=common.positive_int,
                   help="default: cpu 1, cuda 16k tokens / seqlen")
    p.add_argument("--heads", type=common.positive_int)
    p.add_argument("--head-dim", type=common.positive_int, dest="head_dim")
    p.add_argument("--seqlens", type=common.int_list, metavar="LIST",
                   help="comma list, e.g. 512,1024")
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    p.add_argument("--mode", choices=("fwd", "fwdbwd", "both"), default="both")
    p.add_argument("--repeats", type=common.repeats, metavar="N",
                   help=f"timed calls each, >= {common.MIN_REPEATS}")
    p.add_argument("--threads", type=common.positive_int, metavar="N",
                   help="CPU threads (torch.set_num_threads)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds (CI)")
    p.add_argument("--plot", type=plot.plot_path, metavar="FILE",
                   help="draw time and peak memory against seqlen, in the format of FILE's "
                        "extension (png, svg, pdf, ...); needs matplotlib, the bench extra")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="machine-readable results to FILE, or to stdout (the table then goes "
                        "to stderr)")
    varlen.add_arguments(p)
    decode.add_arguments(p)
    sdpa_impl_bench.add_arguments(p)
    args = p.parse_args(argv)
    sdpa_impl_bench.check_arguments(p, args)
    varlen.check_arguments(p, args)
    decode.check_arguments(p, args)
    return p, args


def resolve_settings(args, device_type):
    settings = DEFAULTS[device_type]
    if args.quick:
        settings = replace(settings, **QUICK[device_type])
    overrides = {name: getattr(args, name)
                 for name in ("dtypes", "batch", "heads", "head_dim", "seqlens", "repeats")
                 if getattr(args, name) is not None}
    return replace(settings, **overrides)


def enumerate_cases(args, settings):
    modes = common.MODES if args.mode == "both" else (args.mode,)
    causal_flags = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    return [Case(mode, dtype, causal, seqlen, settings.batch_for(seqlen), settings.heads,
                 settings.head_dim)
            for mode in modes for dtype in settings.dtypes for causal in causal_flags
            for seqlen in settings.seqlens]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser, args = parse_args(argv)
    if args.sdpa_impl:
        return sdpa_impl_bench.main(argv, args, parser)
    if args.varlen:
        return varlen.main(argv, args, parser)
    if args.decode:
        return decode.main(argv, args, parser)
    device = common.resolve_device(args, parser)
    settings = resolve_settings(args, device.type)
    probe = measure.make_probe(device)
    impls = implementations(device.type)
    table = sys.stderr if args.json == "-" else sys.stdout

    print(f"flashattn {__version__} vs F.scaled_dot_product_attention, torch {torch.__version__}"
          f", {device.type} ({probe.describe()}), {settings.repeats} timed repeats", file=table)
    results, group = [], None
    for case in enumerate_cases(args, settings):
        if (case.mode, case.dtype) != group:
            group = (case.mode, case.dtype)
            print(common.table_header(case.mode, common.dtype_name(case.dtype), settings, COLUMNS),
                  file=table)
        for result in measure_case(case, impls, probe, settings, device):
            print(table_row(result), file=table, flush=True)
            results.append(result)
    summary = summarize(results)
    if "fwd" in (common.MODES if args.mode == "both" else (args.mode,)):
        max_size = QUICK_MATMUL_SIZE if args.quick else MATMUL_SIZE[device.type]
        ceilings = {common.dtype_name(dtype): measure.matmul_tflops(dtype, max_size, probe,
                                                              settings.repeats, device)
                    for dtype in settings.dtypes}
        add_matmul_ceilings(summary, results, ceilings)
        if device.type == "cpu":
            seconds = QUICK_TILE_PRODUCTS_SECONDS if args.quick else TILE_PRODUCTS_SECONDS
            tiles = {common.dtype_name(dtype): measure.cpu_tile_products_tflops(
                         dtype, settings.head_dim, seconds)
                     for dtype in settings.dtypes if dtype != torch.float64}
            add_tile_product_ceilings(summary, results, tiles, settings.head_dim)
    print("\n".join(summary_lines(summary)), file=table)

    if args.json:
        report = {"meta": _meta(argv, device, probe, settings, args), "summary": summary,
                  "results": [asdict(r) for r in results]}
        common.write_json(report, args.json)
    # After the JSON, so that a plot that fails to save cannot lose the measurements.
    if args.plot:
        plot.plot_results(args.plot, results, title=(
            f"flashattn {__version__} vs torch {torch.__version__} SDPA on {device.type} "
            f"({probe.describe()}), heads={settings.heads}, head_dim={settings.head_dim}"))
    return 0


def _meta(argv, device, probe, settings, args):
    return {
        "command": " ".join(["python -m flashattn.bench", *argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flashattn": __version__, "torch": torch.__version__,
        "device": device.type, "device_name": probe.describe(),
        "threads": torch.get_num_threads(),
        "dtypes": [common.dtype_name(d) for d in settings.dtypes], "heads": settings.heads,
        "head_dim": settings.head_dim, "seqlens": list(settings.seqlens),
        "batch": settings.batch, "tokens_per_batch": settings.tokens_per_batch,
        "causal": args.causal, "mode": args.mode,
        "repeats": settings.repeats, "warmup": settings.warmup,
        "checked_rows_per_end": measure.CHECKED_ROWS_PER_END,
        "peak_memory": ("CUDA max_memory_allocated above the inputs" if device.type == "cuda"
                        else "Linux peak RSS (VmHWM) above the RSS before the call"),
        "peak_memory_unavailable": probe.memory_note,
    }
