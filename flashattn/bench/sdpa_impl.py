"""`python -m flashattn.bench sdpa-impl [PART]`: flashattn as the implementation behind
torch.nn.functional.scaled_dot_product_attention (flashattn/_sdpa_impl.py), in an unmodified
model, against PyTorch's own kernel.

Two parts (`sdpa-impl train` or `sdpa-impl overhead` runs one of them alone):

train     A small nn.TransformerEncoder (batch_first, dropout 0, 2 layers, feed-forward 4x
          d_model) takes a training step: forward, an MSE loss on the real tokens, backward and
          an AdamW step. Two copies of the same model, one trained with flashattn activated
          (torch.nn.attention.activate_flash_attention_impl("flashattn")), one without; their
          steps are timed in alternation (rotating order), activation and restoration outside
          the clock, and speedup = median over the repeats of t_pytorch / t_flashattn for the
          steps made back to back (with the quartiles of those ratios: on a busy machine they
          show how far the noise moved them). Each size runs in three variants: unmasked, causal
          (mask=generate_square_subsequent_mask, is_causal=True: F.sdpa gets is_causal=True
          and no mask) and key-padding (src_key_padding_mask, lengths from the sequence
          length down to half of it: F.sdpa gets a float (B, H, 1, S) attn_mask).

          Before the clock, both copies take one forward+backward (no optimizer step) on the
          same weights and inputs, under torch.profiler: their loss, output and gradients must
          agree within the dtype's tolerance, the flashattn copy must have run flashattn::fwd
          and flashattn::bwd once per layer, and the PyTorch copy never. A case that fails this
          is not timed and makes the command exit with status 1: the benchmark cannot measure
          PyTorch twice, nor time a wrong result.

overhead  CPU, one thread (torch.set_num_threads(1)), float32, forward only, tiny shapes: what a
          call costs beyond the kernel, for each way of reaching flashattn's kernel (and for
          PyTorch's own): torch.ops.flashattn.fwd called directly, flashattn.
          scaled_dot_product_attention, F.scaled_dot_product_attention with flashattn
          activated, and F.scaled_dot_product_attention without. Each sample times a loop of
          calls of one implementation; samples alternate between the implementations in
          rotating order; microseconds per call are the median over the samples, and the
          "vs op" column the median over samples of the difference to the direct op call made
          back to back. Each implementation's output is compared with PyTorch's, and one call
          of each is profiled to show which kernel ran. Also printed: what one
          activate_flash_attention_impl + restore_flash_attention_impl pair costs.
"""
import argparse
import copy
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn import attention
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _sdpa_impl
from .._interface import scaled_dot_product_attention as flashattn_sdpa
from . import measure, options, summary
from .common import NOT_AVAILABLE, dtype_name
from .table import Table, fmt, times

PARTS = ("all", "train", "overhead")
PYTORCH = "pytorch"
FLASHATTN = "flashattn"
VARIANTS = ("unmasked", "causal", "key-padding")
VARIANTS_FOR_CAUSAL = {"both": VARIANTS, "yes": ("causal",), "no": ("unmasked", "key-padding")}
FA_FWD, FA_BWD = "flashattn::fwd", "flashattn::bwd"
LAYERS = 2
FF_PER_D_MODEL = 4
LEARNING_RATE = 1e-4
SEED = 0  # of the models' weights and inputs
FAILED = "failed"
# loss, output and gradients of the two copies: max |a - b| / max |b|, per tensor, at most this.
# float32: two exact kernels summing in different orders agree to ~1e-6 here; a wrong scale,
# mask or missing term gives O(1).
TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-9, torch.bfloat16: 1e-1,
             torch.float16: 2e-2}


@dataclass(frozen=True)
class Size:
    d_model: int
    nhead: int
    seqlen: int
    batch: int

    def text(self):
        return f"{self.d_model}:{self.nhead}:{self.seqlen}:{self.batch}"


@dataclass(frozen=True)
class Settings:
    dtypes: tuple
    sizes: tuple
    repeats: int
    warmup: int
    overhead_shapes: tuple     # (B, H, S, D)
    overhead_samples: int
    overhead_calls: int        # calls per sample


# CPU: about 2 minutes on two idle cores (the default repeats), several times that on a busy
# machine. head_dim 64 everywhere, the attention's share of the step growing with seqlen.
DEFAULT_SIZES = (Size(256, 4, 128, 8), Size(256, 4, 512, 4), Size(512, 8, 1024, 2))
OVERHEAD_SHAPES = ((1, 2, 16, 16), (1, 4, 64, 64))
DEFAULTS = {
    "cpu": Settings(dtypes=(torch.float32,), sizes=DEFAULT_SIZES, repeats=7, warmup=1,
                    overhead_shapes=OVERHEAD_SHAPES, overhead_samples=101, overhead_calls=50),
    "cuda": Settings(dtypes=(torch.bfloat16,), sizes=DEFAULT_SIZES, repeats=10, warmup=3,
                     overhead_shapes=OVERHEAD_SHAPES, overhead_samples=101, overhead_calls=50),
}
# --quick: seconds, for CI.
QUICK_ON_EVERY_DEVICE = dict(sizes=(Size(64, 4, 48, 2),), repeats=5, warmup=1,
                             overhead_samples=11, overhead_calls=5)
QUICK = {"cpu": QUICK_ON_EVERY_DEVICE, "cuda": QUICK_ON_EVERY_DEVICE}
HELP = ("flashattn as F.sdpa's implementation: a TransformerEncoder training step with and "
        "without it; the per-call cost of each way to the kernel")
DESCRIPTION = (
    f"flashattn as F.scaled_dot_product_attention's implementation: an nn.TransformerEncoder "
    f"training step ({LAYERS} layers, dropout 0, AdamW) with flashattn activated against "
    f"without, timed in alternation, after checking that both give the same loss and gradients "
    f"and that flashattn ran (the command exits with 1 where a check fails); then, on the CPU, "
    f"the per-call cost of each way to call the kernel at tiny shapes, one thread. --causal "
    f"picks the variants (no: unmasked and key-padding), --dtype the training dtype.")
PLOTS = None


def add_arguments(parser):
    parser.add_argument("part", nargs="?", choices=PARTS, default="all",
                        help="all (default), or only the training step or the per-call cost")
    parser.add_argument("--causal", choices=tuple(VARIANTS_FOR_CAUSAL), default="both",
                        help="the training step's variants: both (all three), yes (causal), "
                             "no (unmasked and key-padding)")
    parser.add_argument("--sdpa-sizes", type=_sizes, dest="sizes", metavar="LIST",
                        help="training sizes, comma list of d_model:nhead:seqlen:batch "
                             f"(default {','.join(s.text() for s in DEFAULT_SIZES)})")


def _sizes(text):
    sizes = []
    for part in text.split(","):
        try:
            d_model, nhead, seqlen, batch = (options.positive_int(x) for x in part.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected d_model:nhead:seqlen:batch, positive integers")
        if d_model % nhead:
            raise argparse.ArgumentTypeError(f"{part!r}: nhead must divide d_model")
        sizes.append(Size(d_model, nhead, seqlen, batch))
    return tuple(sizes)


# ---- which kernel ran ----

# ATen's SDPA kernel ops and their backwards (not the F.sdpa entry, which holds them): while
# flashattn is active, its kernels run inside them.
ATTENTION_OPS = "aten::_scaled_dot_product"


def profiled(fn):
    """(fn's result, {event name: count} of the flashattn:: and aten SDPA ops it ran, ms of CPU
    time inside ATen's SDPA kernel ops)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = fn()
    counts, attention_us = {}, 0.0
    for event in prof.events():
        if event.name.startswith("flashattn::") or "scaled_dot_product" in event.name:
            counts[event.name] = counts.get(event.name, 0) + 1
        if event.name.startswith(ATTENTION_OPS):
            attention_us += event.cpu_time_total
    return result, counts, attention_us / 1e3


class SdpaCalls(TorchDispatchMode):
    """Records the arguments of ATen's SDPA kernel ops (not the F.sdpa entry): what the model's
    attention calls really ask for (is_causal, the mask's shape and dtype)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if "_scaled_dot_product" in name and "backward" not in name:
            schema = [a.name for a in func._schema.arguments]
            given = dict(zip(schema, args), **kwargs)
            mask = given.get("attn_mask")
            self.calls.append(
                f"{name.split('.')[-1]}(q {tuple(given['query'].shape)}, "
                f"is_causal={bool(given.get('is_causal', False))}, attn_mask="
                + ("None" if mask is None else
                   f"{dtype_name(mask.dtype)} {tuple(mask.shape)}") + ")")
        return func(*args, **kwargs)


def describe_calls(calls):
    """'2x name(...)' for each distinct call, in order of first appearance."""
    distinct = list(dict.fromkeys(calls))
    return "; ".join(f"{calls.count(c)}x {c}" for c in distinct)


def activated(active):
    """A context manager: flashattn activated as F.sdpa's implementation, or nothing."""
    class Context:
        def __enter__(self):
            if active:
                attention.activate_flash_attention_impl(_sdpa_impl.NAME)

        def __exit__(self, *exc):
            if active:
                attention.restore_flash_attention_impl()
    return Context()


# ---- part 1: a training step ----

@dataclass
class TrainResult:
    dtype: str
    d_model: int
    nhead: int
    seqlen: int
    batch: int
    layers: int
    variant: str
    status: str = "ok"                  # "n/a" (flashattn cannot run it) or "failed" (checks)
    reason: Optional[str] = None
    sdpa_calls: Optional[str] = None    # what the model asked ATen's SDPA op for, PyTorch side
    events: dict = field(default_factory=dict)  # {side: {op: count}} in one forward+backward
    flashattn_ran: Optional[bool] = None  # fwd and bwd once per layer with, never without
    loss: Optional[float] = None        # PyTorch side's loss in that forward+backward
    loss_rel: Optional[float] = None    # |loss_fa - loss_pt| / |loss_pt|
    out_rel: Optional[float] = None     # max |out_fa - out_pt| / max |out_pt|
    grad_rel: Optional[float] = None    # the worst parameter's max |g_fa - g_pt| / max |g_pt|
    tolerance: Optional[float] = None
    same_results: Optional[bool] = None
    time_ms_pytorch: Optional[float] = None
    time_ms_flashattn: Optional[float] = None
    times_ms_pytorch: Optional[list] = None
    times_ms_flashattn: Optional[list] = None
    tokens_per_s_flashattn: Optional[float] = None
    speedup: Optional[float] = None     # median over repeats of t_pytorch / t_flashattn
    speedup_quartiles: Optional[list] = None  # the 25th and 75th percentiles of those ratios
    # CPU: ms inside ATen's SDPA ops (flashattn's kernels in them when active) in one step,
    # profiled: the median over the check step and the warm-up steps, not in alternation.
    attn_ms_pytorch: Optional[float] = None
    attn_ms_flashattn: Optional[float] = None


def make_model(size, dtype, device):
    layer = torch.nn.TransformerEncoderLayer(size.d_model, size.nhead,
                                             FF_PER_D_MODEL * size.d_model, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
    return model.to(device=device, dtype=dtype).train()


def padding_lengths(seqlen, batch):
    """From seqlen down to half of it, evenly: every sequence keeps at least one token."""
    if batch == 1:
        return [seqlen]
    return [max(1, round(seqlen * (1 - 0.5 * b / (batch - 1)))) for b in range(batch)]


class Side:
    """One copy of the model, its optimizer and the step it takes; active: flashattn's side."""

    def __init__(self, model, inputs, active):
        self.model, self.active = model, active
        self.x, self.target, self.kwargs, self.real = inputs
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        self.attn_ms = []  # profiled steps' time in attention

    def forward_loss(self):
        out = self.model(self.x, **self.kwargs)
        diff = out - self.target
        loss = (diff if self.real is None else diff[self.real]).float().square().mean()
        return out, loss

    def check_step(self):
        """One forward+backward, no optimizer step: (loss, out, grads)."""
        self.optimizer.zero_grad(set_to_none=True)
        out, loss = self.forward_loss()
        loss.backward()
        grads = [p.grad.detach().clone() for p in self.model.parameters()]
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), out.detach(), grads

    def train_step(self):
        self.optimizer.zero_grad(set_to_none=True)
        _, loss = self.forward_loss()
        loss.backward()
        self.optimizer.step()
        return loss


def make_inputs(size, variant, dtype, device):
    x = torch.randn(size.batch, size.seqlen, size.d_model, dtype=dtype, device=device)
    target = torch.randn_like(x)
    kwargs, real = {}, None
    if variant == "causal":
        mask = torch.nn.Transformer.generate_square_subsequent_mask(size.seqlen, device=device,
                                                                    dtype=dtype)
        kwargs = dict(mask=mask, is_causal=True)
    elif variant == "key-padding":
        lengths = torch.tensor(padding_lengths(size.seqlen, size.batch), device=device)
        real = torch.arange(size.seqlen, device=device)[None, :] < lengths[:, None]
        kwargs = dict(src_key_padding_mask=~real)  # True: padding, nn.MultiheadAttention's way
    return x, target, kwargs, real


def _rel(a, b):
    scale = b.abs().max().double().item()
    diff = (a.double() - b.double()).abs().max().item()
    return diff / scale if scale > 0 else diff


def clone_model(model):
    """The flashattn side's copy: the same weights (a seam for the tests)."""
    return copy.deepcopy(model)


def check_sides(result, sides, device):
    """Fills result's checks from one profiled forward+backward of each side; returns why the
    case must not be timed, or None."""
    spy = SdpaCalls()  # a forward of its own: the mode doubles the profiler's aten events
    with spy:
        sides[PYTORCH].forward_loss()
    result.sdpa_calls = describe_calls(spy.calls)
    outcomes = {}
    for name, side in sides.items():
        with activated(side.active):
            outcomes[name], result.events[name], attn_ms = profiled(side.check_step)
        side.attn_ms.append(attn_ms)
    fa_events = result.events[FLASHATTN]
    result.flashattn_ran = (fa_events.get(FA_FWD, 0) == LAYERS
                            and fa_events.get(FA_BWD, 0) == LAYERS
                            and not any(n.startswith("flashattn::")
                                        for n in result.events[PYTORCH]))
    (loss_pt, out_pt, grads_pt), (loss_fa, out_fa, grads_fa) = (outcomes[PYTORCH],
                                                                 outcomes[FLASHATTN])
    result.loss = loss_pt.item()
    result.loss_rel = _rel(loss_fa, loss_pt)
    result.out_rel = _rel(out_fa, out_pt)
    result.grad_rel = max(_rel(a, b) for a, b in zip(grads_fa, grads_pt))
    result.same_results = all(math.isfinite(x) and x <= result.tolerance
                              for x in (result.loss_rel, result.out_rel, result.grad_rel))
    if not result.flashattn_ran:
        return (f"flashattn did not run as expected while active ({LAYERS} layers: want "
                f"{FA_FWD} and {FA_BWD} {LAYERS}x each with, none without): "
                f"with {fa_events}, without {result.events[PYTORCH]}")
    if not result.same_results:
        return (f"results differ beyond {result.tolerance:g}: loss {result.loss_rel:.2e}, "
                f"out {result.out_rel:.2e}, grads {result.grad_rel:.2e}")
    return None


def time_in_alternation(sides, probe, repeats):
    """{name: [ms, ...]}: as measure.time_in_alternation (rotating order), with each side's
    activation around its call but outside the clock."""
    names = list(sides)
    times = {name: [] for name in names}
    for repeat in range(repeats):
        first = repeat % len(names)
        for name in names[first:] + names[:first]:
            with activated(sides[name].active):
                times[name].append(probe.time_ms(sides[name].train_step))
    return times


def measure_train(size, variant, dtype, settings, probe, device, seed):
    result = TrainResult(dtype_name(dtype), size.d_model, size.nhead, size.seqlen,
                         size.batch, LAYERS, variant, tolerance=TOLERANCE[dtype])
    torch.manual_seed(seed)
    model = make_model(size, dtype, device)
    inputs = make_inputs(size, variant, dtype, device)
    sides = {PYTORCH: Side(model, inputs, active=False),
             FLASHATTN: Side(clone_model(model), inputs, active=True)}
    try:
        reason = check_sides(result, sides, device)
        if reason:
            result.status, result.reason = FAILED, reason
            if device.type != "cpu" and not result.flashattn_ran:
                # On CUDA F.sdpa picks its backend itself; only its flash backend's op is
                # flashattn's, so another choice is not a failure of flashattn.
                result.status = NOT_AVAILABLE
            return result
        for _ in range(settings.warmup):
            for side in sides.values():
                with activated(side.active):
                    if device.type == "cpu":
                        side.attn_ms.append(profiled(side.train_step)[2])
                    else:
                        side.train_step()
        times = time_in_alternation(sides, probe, settings.repeats)
    except (RuntimeError, MemoryError) as err:
        result.status, result.reason = NOT_AVAILABLE, measure.first_line(err)
        probe.after_failure()
        return result
    result.times_ms_pytorch, result.times_ms_flashattn = times[PYTORCH], times[FLASHATTN]
    result.time_ms_pytorch = statistics.median(times[PYTORCH])
    result.time_ms_flashattn = statistics.median(times[FLASHATTN])
    result.tokens_per_s_flashattn = (size.batch * size.seqlen
                                     / (result.time_ms_flashattn / measure.MS_PER_S))
    result.speedup = measure.paired_speedup(times[PYTORCH], times[FLASHATTN])
    if device.type == "cpu":  # on CUDA the CPU time of an op is not the kernel's
        result.attn_ms_pytorch = statistics.median(sides[PYTORCH].attn_ms)
        result.attn_ms_flashattn = statistics.median(sides[FLASHATTN].attn_ms)
    ratios = [pt / fa for pt, fa in zip(times[PYTORCH], times[FLASHATTN])]
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive")
    result.speedup_quartiles = [quartiles[0], quartiles[2]]
    return result


TRAIN_TABLE = Table((("d_model", 7), ("nhead", 5), ("seqlen", 6), ("batch", 5),
                     ("variant", 11), ("fa_ran", 6), ("loss_rel", 8), ("out_rel", 8),
                     ("grad_rel", 8), ("ms_pytorch", 10), ("ms_flashattn", 12), ("speedup", 7),
                     ("ratio_quartiles", 15), ("attn_ms_pt", 10), ("attn_ms_fa", 10)),
                    reason_width=160)


def train_title(dtype_name):
    return (f"training step (forward, loss, backward, AdamW), nn.TransformerEncoder, {LAYERS} "
            f"layers, {dtype_name}")


def with_status(table, r, cells):
    """A row, and below it why the case was not timed where it was not."""
    line = table.row(cells)
    if r.status != "ok":
        line += f"\n    {r.status}: {r.reason[:table.reason_width]}"
    return line


def train_row(r):
    return with_status(TRAIN_TABLE, r, [
        r.d_model, r.nhead, r.seqlen, r.batch, r.variant,
        "-" if r.flashattn_ran is None else ("yes" if r.flashattn_ran else "NO"),
        fmt(r.loss_rel, ".1e"), fmt(r.out_rel, ".1e"), fmt(r.grad_rel, ".1e"),
        fmt(r.time_ms_pytorch, ".1f"), fmt(r.time_ms_flashattn, ".1f"),
        "-" if r.speedup is None else f"{r.speedup:.3f}x",
        "-" if r.speedup_quartiles is None else
        f"{r.speedup_quartiles[0]:.2f}-{r.speedup_quartiles[1]:.2f}",
        fmt(r.attn_ms_pytorch, ".1f"), fmt(r.attn_ms_flashattn, ".1f")])


def summarize(results):
    """Per (dtype, variant): the training step's speedup with flashattn over the sizes, their
    geometric mean, smallest and largest."""
    groups = {}
    for r in results:
        groups.setdefault((r.dtype, r.variant), []).append(r.speedup)
    entries = []
    for (dtype, variant), speedups in groups.items():
        known = [s for s in speedups if s is not None]
        entries.append({"dtype": dtype, "variant": variant, "sizes": len(known),
                        "geomean_speedup": summary.geomean(known),
                        "speedup_span": summary.span(known)})
    return entries


def train_summary_lines(entries, results):
    lines = ["\nspeedup = t_pytorch / t_flashattn per back-to-back pair of steps, median; > 1: "
             "the step is faster with flashattn activated; ratio_quartiles: the 25th-75th "
             "percentile of those ratios, how far the machine's noise moved them. *_rel: "
             "max |flashattn - pytorch| / "
             "max |pytorch| of the loss, the output and the worst parameter's gradient, one "
             "forward+backward from the same weights and inputs. fa_ran: flashattn::fwd and "
             f"::bwd ran {LAYERS}x each (once per layer) with, never without (profiler). "
             "attn_ms_pt/_fa (CPU): ms of one step inside ATen's SDPA ops, forward and backward "
             "(flashattn's kernels inside them when active), profiled: median over the check "
             "step and the warm-up steps, not timed in alternation."]
    for s in entries:
        text = "n/a"
        if s["geomean_speedup"]:
            low, high = s["speedup_span"]
            text = (f"{s['geomean_speedup']:.3f}x (geometric mean over {s['sizes']} sizes, "
                    f"min {low:.3f}x, max {high:.3f}x)")
        lines.append(f"{s['dtype']}, {s['variant']:>11}: training step with flashattn: {text}")
    lines.append("ATen SDPA calls per forward (PyTorch side, first size of each variant shown):")
    seen = set()
    for r in results:
        if r.sdpa_calls and r.variant not in seen:
            seen.add(r.variant)
            lines.append(f"  {r.variant} {r.d_model}:{r.nhead}:{r.seqlen}:{r.batch}: "
                         f"{r.sdpa_calls}")
    return lines


# ---- part 2: the cost of a call ----

OP = "op"
INTERFACE = "flashattn.sdpa"
ACTIVE = "F.sdpa+flashattn"
PLAIN = "F.sdpa (pytorch)"
OVERHEAD_IMPLS = (OP, INTERFACE, ACTIVE, PLAIN)
OVERHEAD_DESCRIPTIONS = {
    OP: "torch.ops.flashattn.fwd(q, k, v, align_bottom_right=False) on (B, S, H, D) views",
    INTERFACE: "flashattn.scaled_dot_product_attention(q, k, v)",
    ACTIVE: "F.scaled_dot_product_attention(q, k, v), flashattn activated",
    PLAIN: "F.scaled_dot_product_attention(q, k, v), PyTorch's kernel",
}


@dataclass
class CallResult:
    shape: list               # (B, H, S, D)
    impl: str
    description: str
    status: str = "ok"
    reason: Optional[str] = None
    max_diff: Optional[float] = None   # max |out - PyTorch's F.sdpa out|
    flashattn_fwd_events: Optional[int] = None  # in one profiled call
    aten_events: Optional[dict] = None
    us_per_call: Optional[float] = None      # median over samples
    us_min: Optional[float] = None           # fastest sample: what noise did not reach
    us_vs_op: Optional[float] = None         # median over samples of t - t_op, back to back
    ratio_vs_pytorch: Optional[float] = None  # median over samples of t / t_pytorch
    us_samples: Optional[list] = None


def overhead_calls(shape):
    q, k, v = (torch.randn(shape) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, S, H, D) views, no copy
    op = torch.ops.flashattn.fwd
    return {
        OP: (False, lambda: op(qt, kt, vt, align_bottom_right=False)[0].transpose(1, 2)),
        INTERFACE: (False, lambda: flashattn_sdpa(q, k, v)),
        ACTIVE: (True, lambda: F.scaled_dot_product_attention(q, k, v)),
        PLAIN: (False, lambda: F.scaled_dot_product_attention(q, k, v)),
    }


def time_calls_in_alternation(calls, samples, per_sample):
    """{name: [us per call, ...]}: each sample a loop of per_sample calls of one implementation,
    the implementations in rotating order; activation outside the clock."""
    names = list(calls)
    times = {name: [] for name in names}
    for sample in range(samples):
        first = sample % len(names)
        for name in names[first:] + names[:first]:
            active, fn = calls[name]
            with activated(active):
                start = time.perf_counter()
                for _ in range(per_sample):
                    fn()
                elapsed = time.perf_counter() - start
            times[name].append(elapsed / per_sample * 1e6)
    return times


def measure_overhead(shape, settings):
    calls = overhead_calls(shape)
    results = {name: CallResult(list(shape), name, OVERHEAD_DESCRIPTIONS[name])
               for name in calls}
    expected = calls[PLAIN][1]()
    runnable = {}
    for name, (active, fn) in calls.items():
        r = results[name]
        try:
            with activated(active):
                out = fn()
                _, events, _ = profiled(fn)
        except (RuntimeError, MemoryError) as err:
            r.status, r.reason = NOT_AVAILABLE, measure.first_line(err)
            continue
        r.max_diff = (out - expected).abs().max().item()
        r.flashattn_fwd_events = events.get(FA_FWD, 0)
        r.aten_events = {n: c for n, c in events.items() if n.startswith("aten::")}
        if (r.flashattn_fwd_events == 1) != (name != PLAIN):
            r.status, r.reason = FAILED, (f"{FA_FWD} ran {r.flashattn_fwd_events}x in one "
                                          f"call, want {0 if name == PLAIN else 1}")
        elif not r.max_diff <= TOLERANCE[torch.float32]:
            r.status, r.reason = FAILED, f"output differs from PyTorch's by {r.max_diff:.2e}"
        else:
            runnable[name] = (active, fn)
    for active, fn in runnable.values():  # warm-up
        with activated(active):
            for _ in range(settings.overhead_calls):
                fn()
    times = time_calls_in_alternation(runnable, settings.overhead_samples,
                                      settings.overhead_calls)
    for name, samples in times.items():
        r = results[name]
        r.us_samples = samples
        r.us_per_call = statistics.median(samples)
        r.us_min = min(samples)
        if OP in times:
            r.us_vs_op = statistics.median(t - t_op for t, t_op in zip(samples, times[OP]))
        if PLAIN in times:
            r.ratio_vs_pytorch = measure.paired_speedup(samples, times[PLAIN])
    return list(results.values())


def toggle_cost_us(count):
    """Microseconds of one activate_flash_attention_impl + restore_flash_attention_impl pair,
    the mean over count pairs."""
    start = time.perf_counter()
    for _ in range(count):
        attention.activate_flash_attention_impl(_sdpa_impl.NAME)
        attention.restore_flash_attention_impl()
    return (time.perf_counter() - start) / count * 1e6


OVERHEAD_TABLE = Table((("shape", 14), ("impl", 17), ("fa_fwd", 6), ("max_diff", 8),
                        ("us/call", 8), ("min_us", 8), ("vs_op_us", 8), ("vs_pytorch", 10)),
                       reason_width=TRAIN_TABLE.reason_width)


def overhead_title(settings):
    return (f"per-call cost, CPU, 1 thread, float32, forward only, (B, H, S, D); median of "
            f"{settings.overhead_samples} samples of {settings.overhead_calls} calls, "
            f"implementations in alternation")


def overhead_row(r):
    return with_status(OVERHEAD_TABLE, r, [
        "x".join(map(str, r.shape)), r.impl, fmt(r.flashattn_fwd_events, "d"),
        fmt(r.max_diff, ".1e"), fmt(r.us_per_call, ".2f"), fmt(r.us_min, ".2f"),
        fmt(r.us_vs_op, "+.2f"), times(r.ratio_vs_pytorch)])


def overhead_legend(toggle_us):
    lines = ["", "impl:"]
    lines += [f"  {name:>17}: {text}" for name, text in OVERHEAD_DESCRIPTIONS.items()]
    lines += ["fa_fwd: flashattn::fwd events in one profiled call. max_diff: against PyTorch's "
              "F.sdpa. us/call: median over the samples; min_us: the fastest "
              "sample. vs_op_us: median of t - t_op per back-to-back pair of samples, "
              "vs_pytorch: median of t / t_pytorch, likewise (< 1: faster than PyTorch's): on a "
              "busy machine, where every implementation's samples are sometimes slowed alike, "
              "these paired columns and min_us are the ones to read.",
              f"activate_flash_attention_impl + restore_flash_attention_impl: "
              f"{toggle_us:.2f} us per pair"]
    return lines


# ---- the command ----

def run_train(run, settings):
    results = []
    run.print(f"{settings.repeats} timed steps per side after {settings.warmup} warm-up")
    for dtype in settings.dtypes:
        run.print(TRAIN_TABLE.header(train_title(dtype_name(dtype))))
        for size in settings.sizes:
            for variant in VARIANTS_FOR_CAUSAL[run.args.causal]:
                run.progress.step(f"train {dtype_name(dtype)} {size.text()} {variant}")
                result = measure_train(size, variant, dtype, settings, run.probe, run.device,
                                       SEED)
                run.print(train_row(result))
                results.append(result)
    return results


def run_overhead(run, settings):
    """The per-call table, on one thread (given back after); (results, toggle µs)."""
    results = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run.print(OVERHEAD_TABLE.header(overhead_title(settings)))
        for shape in settings.overhead_shapes:
            run.progress.step(f"overhead {'x'.join(map(str, shape))}")
            for r in measure_overhead(shape, settings):
                run.print(overhead_row(r))
                results.append(r)
        return results, toggle_cost_us(10 * settings.overhead_calls)
    finally:
        torch.set_num_threads(threads)


def main(run):
    if not _sdpa_impl.REGISTERED:
        run.parser.error(f"torch {torch.__version__} has no "
                         f"torch.nn.attention.register_flash_attention_impl (torch >= 2.13 has)")
    settings = run.settings(DEFAULTS, QUICK)
    parts = ("train", "overhead") if run.args.part == "all" else (run.args.part,)
    overhead = "overhead" in parts and run.device.type == "cpu"
    train_cases = (len(settings.dtypes) * len(settings.sizes)
                   * len(VARIANTS_FOR_CAUSAL[run.args.causal]) if "train" in parts else 0)
    run.progress.expect(train_cases + (len(settings.overhead_shapes) if overhead else 0))

    run.print_headline("as F.scaled_dot_product_attention's implementation")
    train_results = run_train(run, settings) if "train" in parts else []
    entries = summarize(train_results)
    if train_results:
        run.print(*train_summary_lines(entries, train_results))
    overhead_results, toggle_us = run_overhead(run, settings) if overhead else ([], None)
    if overhead:
        run.print(*overhead_legend(toggle_us))
    elif "overhead" in parts:
        run.print("\nper-call cost: CPU only (run it with --device cpu)")

    failed = [r for r in [*train_results, *overhead_results] if r.status == FAILED]
    if failed:
        run.print(f"\n{len(failed)} check(s) FAILED (see above): those cases were not timed")
    run.write_report({
        "parts": list(parts), "dtypes": [dtype_name(d) for d in settings.dtypes],
        "sizes": [asdict(s) for s in settings.sizes], "layers": LAYERS,
        "dim_feedforward_per_d_model": FF_PER_D_MODEL, "optimizer": "AdamW",
        "learning_rate": LEARNING_RATE,
        "variants": list(VARIANTS_FOR_CAUSAL[run.args.causal]),
        "repeats": settings.repeats, "warmup": settings.warmup, "seed": SEED,
        "overhead_shapes": [list(s) for s in settings.overhead_shapes],
        "overhead_samples": settings.overhead_samples,
        "overhead_calls_per_sample": settings.overhead_calls,
    }, entries, train_results, overhead=overhead_results, toggle_us=toggle_us,
        failed=len(failed))
    return 1 if failed else 0
