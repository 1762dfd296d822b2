"""`python -m flashattn.bench --varlen`: a packed batch of variable-length sequences, against
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
                    (common.SDPA_BACKENDS), on the (B, H, Lmax, D) view of the padded tensors:
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
"""
import datetime
import math
import random
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from .. import __version__
from . import measure
from . import common
from .._interface import flash_attn_func, flash_attn_varlen_func

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
HELP = ("Variable-length batch (--varlen): lognormal lengths (median --median-seqlen, "
        "sigma 1) clipped to [1, --max-seqlen], --total-tokens in all, fixed --seed; "
        "flashattn varlen against padding to the longest (flashattn's dense op and every SDPA "
        "backend) and nested-tensor SDPA; then, on the CPU, flashattn varlen with 1 thread "
        "against all on one 8192-token sequence and fifty of 100 (1 head; --thread-balance "
        "alone). Defaults: CPU float32, 8 heads of 64, 4096 tokens up to 2048 long (about 1.5 "
        "minutes on 2 idle cores, several times that on a busy machine); CUDA bfloat16, 16 heads of 128, 16384 tokens up to 8192 long. --seqlens, "
        "--batch and --plot do not apply.")


def add_arguments(parser):
    group = parser.add_argument_group("variable-length batches", HELP)
    group.add_argument("--varlen", action="store_true",
                       help="benchmark a packed variable-length batch instead of dense ones "
                            "(described above)")
    group.add_argument("--total-tokens", type=common.positive_int, dest="total_tokens",
                       metavar="N", help="tokens in the batch (cpu 4096, cuda 16384)")
    group.add_argument("--max-seqlen", type=common.positive_int, dest="max_seqlen", metavar="N",
                       help="longest sequence allowed (cpu 2048, cuda 8192)")
    group.add_argument("--median-seqlen", type=common.positive_int, dest="median_seqlen",
                       metavar="N", help="median of the lognormal (cpu 128, cuda 512)")
    group.add_argument("--seed", type=int, help="of the lengths and the inputs (default 0)")
    group.add_argument("--thread-balance", action="store_true", dest="thread_balance",
                       default=None, help="CPU: only the thread-balance measurement (about 15 s "
                                          "on 2 idle cores)")


BATCH_OPTIONS = ("total_tokens", "max_seqlen", "median_seqlen", "seed")
VARLEN_ONLY = (*BATCH_OPTIONS, "thread_balance")
DENSE_ONLY = ("seqlens", "batch", "plot")


def check_arguments(parser, args):
    """The options of one mode are errors in the other: silently ignoring one would measure
    something other than what was asked for."""
    if args.varlen:
        given = [name for name in DENSE_ONLY if getattr(args, name) is not None]
        if given:
            parser.error(f"--varlen: {', '.join('--' + n for n in given)} does not apply")
    else:
        given = [name for name in VARLEN_ONLY if getattr(args, name) is not None]
        if given:
            parser.error(f"{', '.join('--' + n.replace('_', '-') for n in given)}: only with "
                         f"--varlen")


def resolve_settings(args, device_type):
    settings = DEFAULTS[device_type]
    if args.quick:
        settings = replace(settings, **QUICK[device_type])
    overrides = {name: getattr(args, name)
                 for name in ("dtypes", "heads", "head_dim", "repeats", *BATCH_OPTIONS)
                 if getattr(args, name) is not None}
    settings = replace(settings, **overrides)
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


def real_flops(lengths, heads, head_dim, causal, mode):
    """FlashAttention's convention per sequence, summed: only the real tokens' work."""
    forward = sum(common.FWD_FLOPS_PER_QKD * heads * length ** 2 * head_dim for length in lengths)
    if causal:
        forward /= 2
    return forward * (1 + common.BWD_FLOPS_PER_FWD) if mode == "fwdbwd" else forward


@dataclass
class Result:
    mode: str
    dtype: str
    causal: bool
    impl: str
    mask: str                          # how this implementation keeps padded keys out
    flops: float                       # the real work (see real_flops), the same for all
    status: str = "ok"                 # or common.NOT_AVAILABLE, with the reason
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


def _sdpa_padded_forced_to(backend):
    def attend(batch, q, k, v, causal):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, Lmax, D) views, no copy
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if causal else batch.key_mask, is_causal=causal)
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
            *(Impl(f"sdpa-{label}", mask, True, _sdpa_padded_forced_to(backend))
              for label, backend in common.SDPA_BACKENDS[device_type]),
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
    flops = real_flops(lengths, settings.heads, settings.head_dim, causal, mode)
    candidates = [(impl.name,
                   Result(mode, common.dtype_name(dtype), causal, impl.name, impl.mask, flops),
                   make_step(impl, batch, mode, causal), make_check(impl, batch, refs))
                  for impl in implementations(device.type, causal)]
    results, times = measure.check_then_time(candidates, probe, settings, common.NOT_AVAILABLE)
    for name, samples in times.items():
        r = results[name]
        seconds = r.time_ms / measure.MS_PER_S
        r.tokens_per_s = sum(lengths) / seconds
        r.tflops = flops / seconds / common.FLOPS_PER_TFLOP
        if VARLEN in times and name != VARLEN:
            r.varlen_speedup = measure.paired_speedup(samples, times[VARLEN])
    return list(results.values())


@dataclass
class Balance:
    mode: str
    dtype: str
    causal: bool
    threads: int                          # all of them; the other side is 1 thread
    status: str = "ok"                    # or common.NOT_AVAILABLE, with the reason
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
    result = Balance(mode, common.dtype_name(dtype), causal, threads)
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
        result.status, result.reason = common.NOT_AVAILABLE, measure.first_line(err)
        probe.after_failure()
        return result
    finally:
        torch.set_num_threads(threads)
    result.times_ms_1_thread, result.times_ms_all_threads = times[1], times[threads]
    result.time_ms_1_thread = statistics.median(times[1])
    result.time_ms_all_threads = statistics.median(times[threads])
    result.speedup = measure.paired_speedup(times[1], times[threads])
    result.tflops_all_threads = (real_flops(lengths, settings.balance_heads, settings.head_dim,
                                            causal, mode)
                                 / (result.time_ms_all_threads / measure.MS_PER_S)
                                 / common.FLOPS_PER_TFLOP)
    return result


COLUMNS = (("causal", 6), ("impl", 16), ("mask", 14), ("max_err", 8), ("dq_err", 8),
           ("time_ms", 10), ("tokens/s", 9), ("TFLOP/s", 8), ("varlen_speedup", 14),
           ("peak_MB", 9))


REASON_WIDTH = 110


def table_header(mode, dtype_name, settings):
    return common.table_header(mode, dtype_name, settings, COLUMNS)


def table_row(r):
    cells = ["yes" if r.causal else "no", r.impl, r.mask]
    if r.status == common.NOT_AVAILABLE:
        head = "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, COLUMNS))
        return f"{head}  {common.NOT_AVAILABLE}: {r.reason[:REASON_WIDTH]}"
    cells += [common.fmt(r.max_err, ".1e"), common.fmt(r.dq_err, ".1e"),
              common.fmt(r.time_ms, ".3f"), common.fmt(r.tokens_per_s, ".3g"),
              common.fmt(r.tflops, ".3g"),
              "-" if r.varlen_speedup is None else f"{r.varlen_speedup:.2f}x",
              common.fmt(r.peak_mb, ".1f")]
    return "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, COLUMNS))


def balance_lines(balances, settings):
    lines = [f"\nthread balance: flashattn-varlen on one {settings.balance_long}-token sequence "
             f"and {settings.balance_count} of {settings.balance_short}, "
             f"heads={settings.balance_heads}, head_dim={settings.head_dim}",
             f"{'mode':>16}  {'causal':>6}  {'1 thread ms':>11}  {'all ms':>10}  "
             f"{'threads':>7}  {'speedup':>7}  {'TFLOP/s':>8}  same output"]
    for b in balances:
        head = f"{common.MODE_TITLES[b.mode]:>16}  {'yes' if b.causal else 'no':>6}"
        if b.status == common.NOT_AVAILABLE:
            lines.append(f"{head}  {common.NOT_AVAILABLE}: {b.reason[:REASON_WIDTH]}")
            continue
        lines.append(f"{head}  {b.time_ms_1_thread:>11.1f}  {b.time_ms_all_threads:>10.1f}  "
                     f"{b.threads:>7}  {b.speedup:>6.2f}x  {b.tflops_all_threads:>8.3g}  "
                     f"{'yes' if b.same_output else 'NO'}")
    return lines


def main(argv, args, parser):
    """bench.main hands over here when --varlen is given."""
    device = common.resolve_device(args, parser)
    if args.thread_balance and device.type != "cpu":
        parser.error("--thread-balance: CPU only (run it with --device cpu)")
    settings = resolve_settings(args, device.type)
    probe = measure.make_probe(device)
    table = sys.stderr if args.json == "-" else sys.stdout
    lengths = sample_lengths(settings.total_tokens, settings.max_seqlen, settings.median_seqlen,
                             settings.sigma, settings.seed)
    summary = lengths_summary(lengths)
    torch.manual_seed(settings.seed)

    print(f"flashattn {__version__} varlen vs padding and nested tensors, torch "
          f"{torch.__version__}, {device.type} ({probe.describe()}), {settings.repeats} timed "
          f"repeats", file=table)
    if not args.thread_balance:
        print(f"lengths (lognormal, median {settings.median_seqlen}, sigma {settings.sigma}, "
              f"clipped to [1, {settings.max_seqlen}], seed {settings.seed}): "
              f"count {summary['count']}, min {summary['min']}, median {summary['median']:g}, "
              f"max {summary['max']}, total {summary['total']} tokens; padded to the max: "
              f"{summary['count'] * summary['max']} tokens, "
              f"{summary['count'] * summary['max'] ** 2 / sum(n * n for n in lengths):.1f}x the "
              f"real attention work", file=table)
    modes = common.MODES if args.mode == "both" else (args.mode,)
    causal_flags = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    results = []
    for mode in () if args.thread_balance else modes:
        for dtype in settings.dtypes:
            print(table_header(mode, common.dtype_name(dtype), settings), file=table)
            for causal in causal_flags:
                for result in measure_case(mode, dtype, causal, lengths, settings, probe,
                                           device):
                    print(table_row(result), file=table, flush=True)
                    results.append(result)
    if results:
        print("\nvarlen_speedup = t_impl / t_flashattn-varlen per back-to-back pair, median; "
              "> 1: varlen is faster. TFLOP/s counts only the real tokens' work for every "
              "implementation.", file=table)

    balances = []
    if device.type == "cpu" and torch.get_num_threads() < 2:
        print("\nthread balance: not measured, this process has 1 thread", file=table)
    elif device.type == "cpu":
        for mode in modes:
            for dtype in settings.dtypes:
                for causal in causal_flags:
                    balances.append(measure_balance(mode, dtype, causal, settings, probe,
                                                    device))
        print("\n".join(balance_lines(balances, settings)), file=table)

    if args.json:
        report = {"meta": _meta(argv, device, probe, settings, args, lengths),
                  "results": [asdict(r) for r in results],
                  "thread_balance": [asdict(b) for b in balances]}
        common.write_json(report, args.json)
    return 0


def _meta(argv, device, probe, settings, args, lengths):
    return {
        "command": " ".join(["python -m flashattn.bench", *argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flashattn": __version__, "torch": torch.__version__,
        "device": device.type, "device_name": probe.describe(),
        "threads": torch.get_num_threads(),
        "dtypes": [common.dtype_name(d) for d in settings.dtypes], "heads": settings.heads,
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
        "peak_memory": ("CUDA max_memory_allocated above the inputs" if device.type == "cuda"
                        else "Linux peak RSS (VmHWM) above the RSS before the call"),
        "peak_memory_unavailable": probe.memory_note,
    }
