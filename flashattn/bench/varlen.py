"""`python -m flashattn.bench varlen`: a packed batch of variable-length sequences, against
padding it to the longest one.

The batch: lognormal lengths (a long tail, as in real fine-tuning data), clipped to
[1, --max-seqlen], drawn with a fixed seed until they hold --total-tokens tokens (the last one
cut to fit), so that runs with the same options measure the same batch. Implementations, each
given the batch in the layout it takes (making that layout is not timed, as a model makes it
once per batch, not per layer):

  flashattn-varlen  flashattn.flash_attn_varlen_func on the packed (total, H, D) tokens
  flashattn-padded  flashattn's dense op on (B, Lmax, H, D), right-padded with zeros. Causal:
                    flash_attn_func(causal=True), which needs no mask (query i of a sequence
                    sees keys j <= i, and every padded key j >= L lies past that). Non-causal:
                    flash_attn_func has no key-padding mask, so the dense op gets FA3's
                    seqused_k (torch.ops.flashattn.fwd(..., seqused_k=lengths)): the padded
                    queries are still computed, the padded keys not.
  sdpa-<backend>    F.scaled_dot_product_attention forced to each backend of the device
                    (sdpa.py), on the (B, H, Lmax, D) view of the padded tensors:
                    is_causal=True when causal (no mask needed, as above), a boolean
                    (B, 1, 1, Lmax) key-padding attn_mask when not.
  sdpa-nested       F.scaled_dot_product_attention on jagged nested tensors made from the
                    packed tokens (torch.nested.nested_tensor_from_jagged, no copy); torch
                    picks the backend.

An implementation that cannot run a case (a backend that refuses a mask, nested tensors a mode)
is reported "n/a" with the first line of its error. Each one's output (and dq) is checked
against a float64 reference on a few sequences of the batch (the longest, the shortest, the
first and the last), only on real rows: padded rows are garbage by design. The dout is 0 on
padded rows, as a loss that ignores padding makes it.

FLOPs count only the real work: per sequence FlashAttention's 4·H·L²·d forward (halved when
causal), 3.5x that for forward+backward, summed over the sequences; every implementation is
credited with the same FLOPs, so the TFLOP/s of a padded one shows what padding wastes.

On the CPU the run ends with a thread-balance check (the issue's "one 8k sequence and fifty
100-token ones must keep both threads busy"): flashattn-varlen on that batch with 1 thread and
with all of them, timed in alternation.

The summary: per direction and dtype, the geometric mean over the cases of flashattn-varlen's
speedup against the fastest SDPA way of each (a padded backend or nested tensors), and against
flashattn-padded.
"""
import math
import random
import statistics
from dataclasses import dataclass, replace
from typing import Optional

import torch
import torch.nn.functional as F

from .._interface import flash_attn_func, flash_attn_varlen_func
from . import measure, options, sdpa, summary
from .common import FLOPS_PER_TFLOP, MODE_TITLES, NOT_AVAILABLE, attention_flops, dtype_name
from .table import Table, case_title, fmt, times

VARLEN = "flashattn-varlen"
PADDED = "flashattn-padded"
NESTED = "sdpa-nested"
# The sequences whose rows are checked against float64: the longest, the shortest, the first
# and the last (cu_seqlens' two ends).
CHECKED = ("longest", "shortest", "first", "last")


@dataclass(frozen=True)
class Settings:
    dtypes: tuple
    heads: int
    head_dim: int
    total_tokens: int
    max_seqlen: int
    median_seqlen: int
    sigma: float          # of log(length): 1.0 gives a long tail (p99 about 10x the median)
    seed: int
    repeats: int
    warmup: int
    balance_long: int     # the thread-balance batch: one sequence of balance_long tokens
    balance_short: int    # and balance_count of balance_short tokens,
    balance_count: int
    balance_heads: int    # with this many heads (1: the long sequence is one (sequence, head)
                          # pair, which only a split along its query blocks can share out)


# CUDA: issue 11's setting, 16k tokens up to 8k long, the 2048-wide model of bench.py's CUDA
# defaults. CPU: a quarter of the tokens and of the lengths (the same seed and sigma draw the
# CUDA batch's lengths divided by about 4), 8 heads of 64 as bench.py's CPU defaults: 1.5
# minutes on two idle AVX-512 cores, several times that on a busy machine, most of it in the
# padded SDPA backends and nested tensors. The thread balance runs on the CPU only, with 1 head
# (see balance_heads).
DEFAULTS = {
    "cpu": Settings(dtypes=(torch.float32,), heads=8, head_dim=64, total_tokens=4096,
                    max_seqlen=2048, median_seqlen=128, sigma=1.0, seed=0, repeats=5, warmup=1,
                    balance_long=8192, balance_short=100, balance_count=50, balance_heads=1),
    "cuda": Settings(dtypes=(torch.bfloat16,), heads=16, head_dim=128, total_tokens=16384,
                     max_seqlen=8192, median_seqlen=512, sigma=1.0, seed=0, repeats=10,
                     warmup=3, balance_long=8192, balance_short=100, balance_count=50,
                     balance_heads=1),
}
# --quick: seconds, for CI.
QUICK = {
    "cpu": dict(heads=2, head_dim=32, total_tokens=512, max_seqlen=128, median_seqlen=32,
                balance_long=512, balance_short=16, balance_count=50),
    "cuda": dict(heads=4, head_dim=64, total_tokens=2048, max_seqlen=512, median_seqlen=64),
}
HELP = ("a packed batch of variable-length sequences: flashattn varlen against padding and "
        "nested tensors; on the CPU, the thread balance")
DESCRIPTION = (
    "A packed batch of variable-length sequences: lognormal lengths (median --median-seqlen, "
    "sigma 1) clipped to [1, --max-seqlen], --total-tokens in all, fixed --seed; flashattn "
    "varlen against padding to the longest (flashattn's dense op and every SDPA backend) and "
    "nested-tensor SDPA, in TFLOP/s of the real tokens' work; then, on the CPU, flashattn "
    "varlen with 1 thread against all on one 8192-token sequence and fifty of 100 (1 head; "
    "--thread-balance alone).")
EPILOG = ("Defaults: CPU float32, 8 heads of 64, 4096 tokens up to 2048 long (about 1.5 minutes "
          "on 2 idle cores, several times that on a busy machine); CUDA bfloat16, 16 heads of "
          "128, 16384 tokens up to 8192 long.")
PLOTS = None


def add_arguments(parser):
    options.add_head_options(parser)
    options.add_mode_options(parser)
    parser.add_argument("--total-tokens", type=options.positive_int, dest="total_tokens",
                        metavar="N", help="tokens in the batch (cpu 4096, cuda 16384)")
    parser.add_argument("--max-seqlen", type=options.positive_int, dest="max_seqlen",
                        metavar="N", help="longest sequence allowed (cpu 2048, cuda 8192)")
    parser.add_argument("--median-seqlen", type=options.positive_int, dest="median_seqlen",
                        metavar="N", help="median of the lognormal (cpu 128, cuda 512)")
    parser.add_argument("--seed", type=int, help="of the lengths and the inputs (default 0)")
    parser.add_argument("--thread-balance", action="store_true", dest="thread_balance",
                        help="CPU: only the thread-balance measurement (about 15 s on 2 idle "
                             "cores)")


def resolve_settings(run):
    settings = run.settings(DEFAULTS, QUICK)
    return replace(settings, median_seqlen=min(settings.median_seqlen, settings.max_seqlen))


def sample_lengths(total_tokens, max_seqlen, median_seqlen, sigma, seed):
    """Lognormal lengths clipped to [1, max_seqlen], drawn until they sum to total_tokens (the
    last one cut to fit). Python's own generator: the same lengths on every machine."""
    rng = random.Random(seed)
    lengths, left = [], total_tokens
    while left > 0:
        length = round(rng.lognormvariate(math.log(median_seqlen), sigma))
        length = min(max(1, length), max_seqlen, left)
        lengths.append(length)
        left -= length
    return lengths


def lengths_summary(lengths):
    return {"count": len(lengths), "min": min(lengths), "median": statistics.median(lengths),
            "max": max(lengths), "total": sum(lengths)}


@dataclass
class Result:
    mode: str
    dtype: str
    causal: bool
    impl: str
    mask: str                          # how this implementation keeps padded keys out
    flops: float                       # the real work only (common.attention_flops over the
                                       # lengths), the same for all
    status: str = "ok"                 # or NOT_AVAILABLE, with the reason
    reason: Optional[str] = None
    max_err: Optional[float] = None    # max |out - float64 reference|, checked rows
    dq_err: Optional[float] = None     # same for dq, forward+backward only
    time_ms: Optional[float] = None    # median of times_ms
    times_ms: Optional[list] = None
    tokens_per_s: Optional[float] = None
    tflops: Optional[float] = None
    varlen_speedup: Optional[float] = None  # median over repeats of t_this / t_varlen
    peak_mb: Optional[float] = None


class Batch:
    """The packed tokens of one case and their padded twins; the same values in every layout."""

    def __init__(self, lengths, heads, head_dim, dtype, device, with_grad, padded=True):
        self.lengths = lengths
        self.max_len, self.min_len = max(lengths), min(lengths)
        self.starts = [0]
        for length in lengths:
            self.starts.append(self.starts[-1] + length)
        self.cu_seqlens = torch.tensor(self.starts, dtype=torch.int32, device=device)
        self.seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
        self.offsets = self.cu_seqlens.long()  # what nested tensors take
        total = self.starts[-1]
        # Fresh random values: zeros would hide masking bugs.
        packed = [torch.randn(total, heads, head_dim, dtype=dtype, device=device)
                  for _ in range(4 if with_grad else 3)]
        self.dout = packed[3] if with_grad else None
        if padded:
            # (B, Lmax, H, D), zeros after each sequence, as torch.nn.utils.rnn.pad_sequence
            # makes it; the dout is then 0 on padded rows, as a loss that ignores them makes it.
            pads = [self.pad(t) for t in packed]
            self.q_pad, self.k_pad, self.v_pad = (t.requires_grad_(with_grad) for t in pads[:3])
            self.dout_pad = pads[3] if with_grad else None
            keys = torch.arange(self.max_len, device=device)
            # True: the key takes part. (B, 1, 1, Lmax) broadcasts over heads and queries.
            self.key_mask = (keys[None, :] < self.seqlens[:, None].long())[:, None, None, :]
        self.q, self.k, self.v = (t.requires_grad_(with_grad) for t in packed[:3])

    def pad(self, packed):
        return torch.nn.utils.rnn.pad_sequence(list(packed.split(self.lengths)),
                                               batch_first=True)

    def checked_sequences(self):
        order = sorted(range(len(self.lengths)), key=lambda b: self.lengths[b])
        picks = {"longest": order[-1], "shortest": order[0], "first": 0,
                 "last": len(self.lengths) - 1}
        return sorted(set(picks[name] for name in CHECKED))

    # One sequence of a tensor, as (1, H, L, D), the layout of measure.reference_rows.
    def from_packed(self, t, b):
        return t[self.starts[b]:self.starts[b + 1]].unsqueeze(0).transpose(1, 2)

    def from_padded(self, t, b):
        return t[b:b + 1, :self.lengths[b]].transpose(1, 2)


@dataclass(frozen=True)
class Impl:
    name: str
    mask: str
    padded: bool      # takes the padded (B, Lmax, H, D) tensors, else the packed ones
    attend: object    # (batch, q, k, v, causal) -> out in the layout of q


def _varlen(batch, q, k, v, causal):
    return flash_attn_varlen_func(q, k, v, batch.cu_seqlens, batch.cu_seqlens, batch.max_len,
                                  batch.max_len, causal=causal)


def _padded(batch, q, k, v, causal):
    if causal:
        return flash_attn_func(q, k, v, causal=True)
    out, _ = torch.ops.flashattn.fwd(q, k, v, seqused_k=batch.seqlens)
    return out


def _sdpa_padded(forced):
    def attend(batch, q, k, v, causal):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, Lmax, D) views, no copy
        out = forced(q, k, v, attn_mask=None if causal else batch.key_mask, is_causal=causal)
        return out.transpose(1, 2)
    return attend


def _sdpa_nested(batch, q, k, v, causal):
    # (B, H, j, D) views of the packed tokens; given the lengths' bounds, torch needs no sync
    q, k, v = (torch.nested.nested_tensor_from_jagged(
        t, batch.offsets, min_seqlen=batch.min_len, max_seqlen=batch.max_len).transpose(1, 2)
        for t in (q, k, v))
    try:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    except RuntimeError as err:
        # Its errors can be far from the point (a CUDA driver check on a CPU tensor): say who.
        raise RuntimeError(f"torch's jagged SDPA raised {type(err).__name__}: "
                           f"{measure.first_line(err)}") from err
    return out.transpose(1, 2).values()


def implementations(device_type, causal):
    mask = "none (causal)" if causal else "bool (B,1,1,L)"
    return [Impl(VARLEN, "cu_seqlens", False, _varlen),
            Impl(PADDED, "none (causal)" if causal else "seqused_k", True, _padded),
            *(Impl(name, mask, True, _sdpa_padded(forced))
              for name, forced in sdpa.forced_backends(device_type)),
            Impl(NESTED, "jagged", False, _sdpa_nested)]


def make_step(impl, batch, mode, causal):
    if impl.padded:
        q, k, v, dout = batch.q_pad, batch.k_pad, batch.v_pad, batch.dout_pad
    else:
        q, k, v, dout = batch.q, batch.k, batch.v, batch.dout
    if mode == "fwd":
        return lambda: (impl.attend(batch, q, k, v, causal), None)

    def forward_backward():
        out = impl.attend(batch, q, k, v, causal)
        return out, torch.autograd.grad(out, (q, k, v), dout)
    return forward_backward


def references(batch, causal, with_dq):
    """{b: measure.ReferenceRows blocks} for the checked sequences, each on its own."""
    return {b: measure.reference_rows(
                *(batch.from_packed(t, b) for t in (batch.q, batch.k, batch.v)),
                batch.from_packed(batch.dout, b) if with_dq else None, causal, with_dq)
            for b in batch.checked_sequences()}


def make_check(impl, batch, refs):
    sequence = batch.from_padded if impl.padded else batch.from_packed

    def check(out, grads):
        def worst(tensor, field):
            return max(measure.max_error(sequence(tensor, b), blocks, field)
                       for b, blocks in refs.items())
        return worst(out, "out"), None if grads is None else worst(grads[0], "dq")
    return check


def measure_case(mode, dtype, causal, lengths, settings, probe, device):
    batch = Batch(lengths, settings.heads, settings.head_dim, dtype, device,
                  with_grad=mode == "fwdbwd")
    refs = references(batch, causal, with_dq=mode == "fwdbwd")
    flops = attention_flops(mode, causal, settings.heads, settings.head_dim, lengths)
    candidates = [(impl.name,
                   Result(mode, dtype_name(dtype), causal, impl.name, impl.mask, flops),
                   make_step(impl, batch, mode, causal), make_check(impl, batch, refs))
                  for impl in implementations(device.type, causal)]
    results, samples = measure.check_then_time(candidates, probe, settings, NOT_AVAILABLE)
    for name, times_ms in samples.items():
        r = results[name]
        seconds = r.time_ms / measure.MS_PER_S
        r.tokens_per_s = sum(lengths) / seconds
        r.tflops = flops / seconds / FLOPS_PER_TFLOP
        if VARLEN in samples and name != VARLEN:
            r.varlen_speedup = measure.paired_speedup(times_ms, samples[VARLEN])
    return list(results.values())


@dataclass
class Balance:
    mode: str
    dtype: str
    causal: bool
    threads: int                          # all of them; the other side is 1 thread
    status: str = "ok"                    # or NOT_AVAILABLE, with the reason
    reason: Optional[str] = None
    time_ms_1_thread: Optional[float] = None
    time_ms_all_threads: Optional[float] = None
    speedup: Optional[float] = None       # median over repeats of t_1 / t_all, back to back
    tflops_all_threads: Optional[float] = None
    same_output: Optional[bool] = None    # bit for bit, as the CPU kernels promise
    times_ms_1_thread: Optional[list] = None
    times_ms_all_threads: Optional[list] = None


def balance_lengths(settings):
    return [settings.balance_long] + [settings.balance_short] * settings.balance_count


def measure_balance(mode, dtype, causal, settings, probe, device):
    """flashattn-varlen on one long and many short sequences, 1 thread against all of them,
    in alternation (torch.set_num_threads before each call, inside the timed call: the kernels
    run on at::parallel_for's threads)."""
    threads = torch.get_num_threads()
    result = Balance(mode, dtype_name(dtype), causal, threads)
    lengths = balance_lengths(settings)
    batch = Batch(lengths, settings.balance_heads, settings.head_dim, dtype, device,
                  with_grad=mode == "fwdbwd", padded=False)
    step = make_step(Impl(VARLEN, "cu_seqlens", False, _varlen), batch, mode, causal)

    def on(n):
        def call():
            torch.set_num_threads(n)
            return step()
        return call
    steps = {1: on(1), threads: on(threads)}
    try:
        outputs = {}
        for n, call in steps.items():
            for _ in range(settings.warmup):
                out, grads = call()
            outputs[n] = [out.detach(), *(grads or ())]
            del out, grads
        result.same_output = all(torch.equal(a, b)
                                 for a, b in zip(outputs[1], outputs[threads]))
        del outputs
        times = measure.time_in_alternation(steps, probe, settings.repeats)
    except (RuntimeError, MemoryError) as err:
        result.status, result.reason = NOT_AVAILABLE, measure.first_line(err)
        probe.after_failure()
        return result
    finally:
        torch.set_num_threads(threads)
    result.times_ms_1_thread, result.times_ms_all_threads = times[1], times[threads]
    result.time_ms_1_thread = statistics.median(times[1])
    result.time_ms_all_threads = statistics.median(times[threads])
    result.speedup = measure.paired_speedup(times[1], times[threads])
    result.tflops_all_threads = (attention_flops(mode, causal, settings.balance_heads,
                                                 settings.head_dim, lengths)
                                 / (result.time_ms_all_threads / measure.MS_PER_S)
                                 / FLOPS_PER_TFLOP)
    return result


TABLE = Table((("causal", 6), ("impl", 16), ("mask", 14), ("max_err", 8), ("dq_err", 8),
               ("time_ms", 10), ("tokens/s", 9), ("TFLOP/s", 8), ("varlen_speedup", 14),
               ("peak_MB", 9)), reason_width=110)
REASON_WIDTH = TABLE.reason_width


def table_row(r):
    cells = ["yes" if r.causal else "no", r.impl, r.mask]
    if r.status == NOT_AVAILABLE:
        return TABLE.not_available(cells, r.reason)
    return TABLE.row([*cells, fmt(r.max_err, ".1e"), fmt(r.dq_err, ".1e"), fmt(r.time_ms, ".3f"),
                      fmt(r.tokens_per_s, ".3g"), fmt(r.tflops, ".3g"), times(r.varlen_speedup),
                      fmt(r.peak_mb, ".1f")])


def summarize(results):
    """Per (mode, dtype): the geometric mean over the cases (causal and not) of flashattn-varlen's
    speedup against the fastest SDPA way of each case, and against flashattn-padded."""
    def geomeans(competitor):
        return summary.smallest_speedup_per_case(
            results, group=lambda r: (r.mode, r.dtype), case=lambda r: r.causal,
            speedup=lambda r: r.varlen_speedup if competitor(r.impl) else None)
    vs_sdpa = geomeans(lambda impl: impl.startswith("sdpa-"))
    vs_padded = geomeans(lambda impl: impl == PADDED)
    return [{"mode": mode, "dtype": dtype, "cases": len(speedups),
             "geomean_speedup_vs_best_sdpa": summary.geomean(speedups),
             "geomean_speedup_vs_flashattn_padded": summary.geomean(vs_padded[(mode, dtype)])}
            for (mode, dtype), speedups in vs_sdpa.items()]


def summary_lines(entries):
    lines = ["", "varlen_speedup = t_impl / t_flashattn-varlen per back-to-back pair, median; > 1: "
                 "varlen is faster. TFLOP/s counts only the real tokens' work for every "
                 "implementation."]
    for s in entries:
        padded = s["geomean_speedup_vs_flashattn_padded"]
        lines.append(f"{MODE_TITLES[s['mode']]:>16}, {s['dtype']}: flashattn-varlen vs the best "
                     f"SDPA way (padded backends, nested): "
                     f"{summary.geomean_text(s['geomean_speedup_vs_best_sdpa'], s['cases'])}; "
                     f"vs {PADDED}: {'n/a' if padded is None else f'{padded:.2f}x'}")
    return lines


def balance_lines(balances, settings):
    lines = [f"\nthread balance: flashattn-varlen on one {settings.balance_long}-token sequence "
             f"and {settings.balance_count} of {settings.balance_short}, "
             f"heads={settings.balance_heads}, head_dim={settings.head_dim}",
             f"{'mode':>16}  {'causal':>6}  {'1 thread ms':>11}  {'all ms':>10}  "
             f"{'threads':>7}  {'speedup':>7}  {'TFLOP/s':>8}  same output"]
    for b in balances:
        head = f"{MODE_TITLES[b.mode]:>16}  {'yes' if b.causal else 'no':>6}"
        if b.status == NOT_AVAILABLE:
            lines.append(f"{head}  {NOT_AVAILABLE}: {b.reason[:REASON_WIDTH]}")
            continue
        lines.append(f"{head}  {b.time_ms_1_thread:>11.1f}  {b.time_ms_all_threads:>10.1f}  "
                     f"{b.threads:>7}  {b.speedup:>6.2f}x  {b.tflops_all_threads:>8.3g}  "
                     f"{'yes' if b.same_output else 'NO'}")
    return lines


def lengths_line(lengths, settings):
    s = lengths_summary(lengths)
    return (f"lengths (lognormal, median {settings.median_seqlen}, sigma {settings.sigma}, "
            f"clipped to [1, {settings.max_seqlen}], seed {settings.seed}): count {s['count']}, "
            f"min {s['min']}, median {s['median']:g}, max {s['max']}, total {s['total']} "
            f"tokens; padded to the max: {s['count'] * s['max']} tokens, "
            f"{s['count'] * s['max'] ** 2 / sum(n * n for n in lengths):.1f}x the real "
            f"attention work")


def case_label(mode, dtype, causal):
    return f"{mode} {dtype_name(dtype)} {'causal' if causal else 'non-causal'}"


def main(run):
    args, device = run.args, run.device
    if args.thread_balance and device.type != "cpu":
        run.parser.error("--thread-balance: CPU only (run it with --device cpu)")
    settings = resolve_settings(run)
    lengths = sample_lengths(settings.total_tokens, settings.max_seqlen, settings.median_seqlen,
                             settings.sigma, settings.seed)
    torch.manual_seed(settings.seed)
    modes, causal_flags = options.modes(args), options.causal_flags(args)
    cases = [(mode, dtype, causal) for mode in modes for dtype in settings.dtypes
             for causal in causal_flags]
    balance = device.type == "cpu" and torch.get_num_threads() >= 2
    run.progress.expect((0 if args.thread_balance else len(cases))
                        + (len(cases) if balance else 0))

    run.print_headline("varlen vs padding and nested tensors", settings.repeats)
    results = []
    if not args.thread_balance:
        run.print(lengths_line(lengths, settings))
    for mode in () if args.thread_balance else modes:
        for dtype in settings.dtypes:
            run.print(TABLE.header(case_title(mode, dtype_name(dtype), settings.heads,
                                              settings.head_dim)))
            for causal in causal_flags:
                run.progress.step(case_label(mode, dtype, causal))
                for result in measure_case(mode, dtype, causal, lengths, settings, run.probe,
                                           device):
                    run.print(table_row(result))
                    results.append(result)
    entries = summarize(results)
    if results:
        run.print(*summary_lines(entries))

    balances = []
    if device.type == "cpu" and not balance:
        run.print("\nthread balance: not measured, this process has 1 thread")
    elif balance:
        for mode, dtype, causal in cases:
            run.progress.step(f"thread balance {case_label(mode, dtype, causal)}")
            balances.append(measure_balance(mode, dtype, causal, settings, run.probe, device))
        run.print(*balance_lines(balances, settings))

    run.write_report({
        "dtypes": [dtype_name(d) for d in settings.dtypes], "heads": settings.heads,
        "head_dim": settings.head_dim, "total_tokens": settings.total_tokens,
        "max_seqlen": settings.max_seqlen, "median_seqlen": settings.median_seqlen,
        "sigma": settings.sigma, "seed": settings.seed,
        "lengths": lengths, "lengths_summary": lengths_summary(lengths),
        "padded_tokens": len(lengths) * max(lengths),
        "causal": args.causal, "mode": args.mode,
        "repeats": settings.repeats, "warmup": settings.warmup,
        "checked_sequences": list(CHECKED),
        "checked_rows_per_end": measure.CHECKED_ROWS_PER_END,
        "thread_balance_batch": ({"lengths": balance_lengths(settings),
                                  "heads": settings.balance_heads}
                                 if device.type == "cpu" else None),
        **measure.memory_meta(run.probe),
    }, entries, results, thread_balance=balances)
    return 0
