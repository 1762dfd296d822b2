"""`python -m flashattn.bench small`: what one call costs at small shapes, where the kernel's
work is a few microseconds and the cost of reaching it (argument checks, dispatch, allocation,
autograd) is most of the time: decoding-sized and short-sequence calls.

The dense subcommand's measurement (dense.py) at S 1, 16, 64 and 128, B 1 and 8, 8 heads of 64,
causal and not, forward and forward+backward: flashattn's flash_attn_func, called as
FlashAttention-2 users call it, on (B, S, H, D) views of the inputs, against every SDPA backend
of the device on the same tensors in (B, H, S, D). Each call is checked against float64 first,
then timed in interleaved rounds (rounds.py, as tools/small_targets.py times issue 29's
targets): every round a block of calls of each implementation back to back, the order reversed
every other round. Times in microseconds per call (median over the rounds), flashattn's speedup
per round (median and interquartile range), and per direction and dtype the geometric mean of
its median speedup over the fastest SDPA backend of each shape.

On CUDA it also reports each call's host time (host_us, issue 29): how long the Python call
takes to return, CUDA being asynchronous, while the GPU is still busy with work queued before
it, so that the clock sees only the host's side (argument handling, dispatch, allocation,
autograd, launches), for flashattn and every SDPA backend, in a second table and the JSON's
"host_us". The CPU's output is unchanged: there a call returns when its work is done.
"""
import dataclasses
import functools
import statistics
import time
from dataclasses import dataclass
from typing import Optional

import torch

from .._interface import flash_attn_func
from . import dense, measure, options, rounds
from .common import dtype_name
from .table import Table, case_title, fmt, times

HELP = ("per-call cost at small shapes (S 1-128, B 1 and 8): flash_attn_func against every SDPA "
        "backend, in microseconds")
DESCRIPTION = ("What one call costs at small shapes, where reaching the kernel is most of the "
               "time: flashattn's flash_attn_func on (B, S, H, D) views against every "
               "F.scaled_dot_product_attention backend of the device, each checked against "
               "float64, then timed in interleaved rounds: a block of calls of each implementation "
               "back to back, the order reversed every other round.")
EPILOG = ("Defaults: S 1,16,64,128, B 1,8, 8 heads of 64, causal and not, forward and "
          "forward+backward; CPU float32, CUDA bfloat16; 51 rounds (--repeats) of ~1 ms "
          "blocks. --quick: S 16,64 at B 1, 11 rounds.")
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


# repeats: the rounds. Many (cheap here) steady the medians and the quartiles.
DEFAULTS = {
    "cpu": Settings(dtypes=(torch.float32,), batches=(1, 8), heads=8, head_dim=64,
                    seqlens=(1, 16, 64, 128), repeats=51, warmup=5),
    "cuda": Settings(dtypes=(torch.bfloat16,), batches=(1, 8), heads=8, head_dim=64,
                     seqlens=(1, 16, 64, 128), repeats=51, warmup=5),
}
# --quick: a couple of shapes, seconds, for CI.
QUICK = {device: dict(batches=(1,), seqlens=(16, 64), repeats=11) for device in DEFAULTS}
# A round's block of calls of one implementation: long against the clock's overhead, short
# against bursts of load (tools/small_targets.py's blocks of 100 forwards or 20
# forward+backwards take 0.5-3 ms). Sized by the fastest implementation's single calls.
BLOCK_MS = 1.0
SIZING_CALLS = 3

# Host time per call: the devices whose calls return before their work is done.
HOST_TIMED_DEVICES = {"cuda"}
HOST_CALLS = 200   # timed calls per implementation and case, back to back, no sync between
HOST_WARMUP = 20
# GPU cycles of torch.cuda._sleep queued before the timed calls: ~10 ms at 1-2 GHz, longer than
# HOST_CALLS calls of tens of microseconds, so the GPU is busy throughout and no call waits
# for it (nor is the launch queue, ~1000 entries, ever full).
BUSY_CYCLES = 20_000_000


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


@dataclass
class SmallResult(dense.Result):
    calls_per_block: Optional[int] = None  # calls in each round's block of this case
    speedup_q1: Optional[float] = None     # interquartile range of the per-round speedups
    speedup_q3: Optional[float] = None


class InterleavedTiming:
    """measure.check_then_time's timing of one case: rounds.interleaved_rounds of the steps,
    in blocks of block_ms sized by the fastest step's single calls; {name: [ms per call, one
    per round]}. Keeps the calls per block it chose in .calls."""

    def __init__(self, probe, round_count, block_ms=BLOCK_MS, sizing_calls=SIZING_CALLS):
        self.probe, self.round_count = probe, round_count
        self.block_ms, self.sizing_calls = block_ms, sizing_calls
        self.calls = None

    def __call__(self, steps):
        if not steps:
            return {}
        fastest_ms = min(statistics.median(self.probe.time_ms(step)
                                           for _ in range(self.sizing_calls))
                         for step in steps.values())
        self.calls = rounds.calls_per_block(fastest_ms, self.block_ms)
        return rounds.interleaved_rounds(steps, self.round_count, self.calls,
                                         time_block=self.time_block)

    def time_block(self, step, calls):
        """ms per call of a block, by the probe's clock (CUDA events on CUDA)."""
        return self.probe.time_ms(functools.partial(rounds.repeat, step, calls)) / calls


def measure_case(case, impls, run, settings):
    """dense.measure_case timed in interleaved rounds: [SmallResult], each speedup the median
    of the per-round ratios (dense's paired speedup, a round being the pair) with its
    quartiles."""
    timing = InterleavedTiming(run.probe, settings.repeats)
    results = [SmallResult(**dataclasses.asdict(r))
               for r in dense.measure_case(case, impls, run, settings, timing=timing)]
    ours = next((r.times_ms for r in results if r.impl == dense.FLASHATTN and r.times_ms), None)
    for r in results:
        if r.times_ms is not None:
            r.calls_per_block = timing.calls
        if ours and r.speedup is not None:
            r.speedup_q1, _, r.speedup_q3 = rounds.quartiles(rounds.round_ratios(r.times_ms,
                                                                                 ours))
    return results


TABLE = Table((("causal", 6), ("seqlen", 6), ("batch", 5), ("impl", 14), ("max_err", 8),
               ("dq_err", 8), ("time_us", 10), ("fa_speedup", 10), ("speedup_IQR", 11),
               ("peak_MB", 9)), reason_width=70)
LEGEND = ("time_us: per call, median over the rounds (each round a block of calls of every "
          "implementation, back to back, the order reversed every other round); fa_speedup = "
          "t_sdpa / t_flashattn per round, median, speedup_IQR its interquartile range; > 1: "
          "flashattn is faster.")


def table_cells(r):
    iqr = (None if r.speedup_q1 is None
           else f"{r.speedup_q1:.2f}-{r.speedup_q3:.2f}")
    return [fmt(r.max_err, ".1e"), fmt(r.dq_err, ".1e"),
            fmt(None if r.time_ms is None else r.time_ms * US_PER_MS, ".1f"), times(r.speedup),
            iqr or "-", fmt(r.peak_mb, ".1f")]


def host_time_us(step, sync, busy, timer=time.perf_counter, calls=HOST_CALLS,
                 warmup=HOST_WARMUP):
    """Median host time of one call of step(), in microseconds: warmed up and synchronized,
    the device made busy (busy()), then `calls` calls back to back, each timed from entry to
    return with no synchronization in the clock; the outputs are dropped after it."""
    for _ in range(warmup):
        step()
    sync()
    busy()
    samples = []
    for _ in range(calls):
        start = timer()
        outputs = step()
        samples.append(timer() - start)
        del outputs
    sync()
    return statistics.median(samples) * US_PER_S


US_PER_S = 1e6


def host_clock(device):
    """(sync, busy) for host_time_us on `device`: CUDA's, or no-ops where calls are
    synchronous."""
    if device.type != "cuda":
        return (lambda: None), (lambda: None)
    return cuda_sync_and_busy(device)


def cuda_sync_and_busy(device):
    def sync():
        torch.cuda.synchronize(device)

    def busy():
        with torch.cuda.device(device):
            torch.cuda._sleep(BUSY_CYCLES)
    return sync, busy


def measure_host_times(cases, impls, device, results, sync, busy, timer=time.perf_counter,
                       calls=HOST_CALLS, warmup=HOST_WARMUP):
    """Host µs per call of every implementation that ran in `results` (dense.Result), case by
    case on fresh inputs: [{mode, dtype, causal, seqlen, batch, impl, host_us,
    fa_host_speedup}], fa_host_speedup = host_us / flashattn's host_us of the same case (> 1:
    flashattn's call returns sooner), None for flashattn itself."""
    ran = {(r.mode, r.dtype, r.causal, r.seqlen, r.batch, r.impl) for r in results
           if r.status == "ok"}
    rows = []
    for case in cases:
        q, k, v, dout = dense.make_inputs(case, device)
        case_rows = []
        for impl in impls:
            key = (case.mode, dtype_name(case.dtype), case.causal, case.seqlen, case.batch,
                   impl.name)
            if key not in ran:
                continue
            step = dense.make_step(impl, case, q, k, v, dout)
            host_us = host_time_us(step, sync, busy, timer=timer, calls=calls, warmup=warmup)
            case_rows.append({"mode": case.mode, "dtype": dtype_name(case.dtype),
                              "causal": case.causal, "seqlen": case.seqlen, "batch": case.batch,
                              "impl": impl.name, "host_us": host_us, "fa_host_speedup": None})
        ours = next((r["host_us"] for r in case_rows if r["impl"] == dense.FLASHATTN), None)
        for r in case_rows:
            if ours and r["impl"] != dense.FLASHATTN:
                r["fa_host_speedup"] = r["host_us"] / ours
        rows += case_rows
    return rows


HOST_TABLE = Table((("causal", 6), ("seqlen", 6), ("batch", 5), ("impl", 14), ("host_us", 9),
                    ("fa_host_speedup", 15)), reason_width=70)
HOST_LEGEND = ("host_us: median time for the call to return, the GPU kept busy so that no call "
               "waits for it (CPU time per call); fa_host_speedup = host_us / flashattn's host_us; "
               "> 1: flashattn's call returns sooner.")


def host_table_lines(rows, heads, head_dim):
    lines, group = [], None
    for r in rows:
        if (r["mode"], r["dtype"]) != group:
            group = (r["mode"], r["dtype"])
            lines.append(HOST_TABLE.header("host time per call: " + case_title(
                r["mode"], r["dtype"], heads, head_dim)))
        lines.append(HOST_TABLE.row(["yes" if r["causal"] else "no", r["seqlen"], r["batch"],
                                     r["impl"], fmt(r["host_us"], ".1f"),
                                     times(r["fa_host_speedup"])]))
    return [*lines, "", HOST_LEGEND] if lines else []


def main(run):
    settings = run.settings(DEFAULTS, QUICK)
    run.print_headline("per-call cost at small shapes vs F.scaled_dot_product_attention, "
                       f"{settings.repeats} interleaved rounds of ~{BLOCK_MS:g} ms blocks")
    cases, impls = enumerate_cases(run.args, settings), implementations(run.device.type)
    results = dense.measure_cases(run, cases, impls, settings, TABLE, table_cells,
                                  measure_one=measure_case)
    entries = dense.summarize(results)
    run.print(*dense.summary_lines(entries, LEGEND))
    extra = {}
    if run.device.type in HOST_TIMED_DEVICES:
        sync, busy = host_clock(run.device)
        extra["host_us"] = measure_host_times(cases, impls, run.device, results, sync, busy,
                                              calls=HOST_CALLS, warmup=HOST_WARMUP)
        extra["host_timing"] = {"calls": HOST_CALLS, "warmup": HOST_WARMUP,
                                "busy_cycles": BUSY_CYCLES, "statistic": "median"}
        run.print(*host_table_lines(extra["host_us"], settings.heads, settings.head_dim))
    run.write_report({
        "flashattn_call": "flash_attn_func(q, k, v, causal=...) on (B, S, H, D) views",
        "dtypes": [dtype_name(d) for d in settings.dtypes], "batches": list(settings.batches),
        "heads": settings.heads, "head_dim": settings.head_dim,
        "seqlens": list(settings.seqlens), "causal": run.args.causal, "mode": run.args.mode,
        "repeats": settings.repeats, "warmup": settings.warmup,
        "timing": {"method": "interleaved rounds", "rounds": settings.repeats,
                   "block_ms": BLOCK_MS, "order": "reversed every other round",
                   "statistic": "median per-round ratio, with its quartiles"},
        "checked_rows_per_end": measure.CHECKED_ROWS_PER_END, **measure.memory_meta(run.probe),
    }, entries, results, **extra)
    return 0
