"""Measuring primitives of `python -m flashattn.bench`: per-device timers and peak-memory probes,
the check-then-time of one case, and the error against the float64 reference.

Nothing here knows about implementations or tables; the subcommands compose these pieces.
"""
import ctypes
import gc
import statistics
import time
import warnings
from dataclasses import dataclass

import torch

from .._reference import attention_reference
from . import machine

BYTES_PER_MB = 1024 * 1024
KB_PER_MB = 1024
MS_PER_S = 1e3

# The float64 reference materializes (rows x seqlen) scores, so for long sequences only this many
# query rows at each end are checked. Attention rows are independent, so a row block is exact;
# the first rows see the fewest keys under a causal mask and the last ones the most.
CHECKED_ROWS_PER_END = 128

# Writing this to /proc/self/clear_refs resets the process's peak RSS (VmHWM) to its current RSS.
_RESET_PEAK_RSS = "5"


class CpuProbe:
    """Wall-clock timing and Linux peak-RSS measurement for CPU kernels."""

    memory_method = "Linux peak RSS (VmHWM) above the RSS before the call"

    def __init__(self):
        self.memory_note = None if _can_reset_peak_rss() else "no writable /proc/self/clear_refs"

    def describe(self):
        return f"{machine.cpu_model()}, {torch.get_num_threads()} threads"

    def time_ms(self, step):
        start = time.perf_counter()
        result = step()
        elapsed = time.perf_counter() - start
        del result  # freed outside the timed region, like the output of a real caller
        return elapsed * MS_PER_S

    def peak_extra_mb(self, step):
        """Peak RSS during one call above the RSS before it (inputs included there), or None."""
        if self.memory_note:
            return None
        _return_free_heap_to_os()
        with open("/proc/self/clear_refs", "w") as f:
            f.write(_RESET_PEAK_RSS)
        baseline_kb = _proc_status_kb("VmHWM")
        result = step()
        peak_kb = _proc_status_kb("VmHWM")
        del result
        return (peak_kb - baseline_kb) / KB_PER_MB

    def after_failure(self):
        # The failure's traceback forms reference cycles that keep its tensors alive.
        gc.collect()


class CudaProbe:
    """CUDA-event timing and caching-allocator peak memory for CUDA kernels."""

    memory_method = "CUDA max_memory_allocated above the inputs"
    memory_note = None

    def __init__(self, device):
        self.device = device

    def describe(self):
        return torch.cuda.get_device_name(self.device)

    def time_ms(self, step):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        result = step()
        end.record()
        end.synchronize()
        del result
        return start.elapsed_time(end)

    def peak_extra_mb(self, step):
        """Peak allocated memory during one call above what was allocated before (the inputs)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        baseline = torch.cuda.memory_allocated(self.device)
        result = step()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        del result
        return (peak - baseline) / BYTES_PER_MB

    def after_failure(self):
        # The failure's traceback forms reference cycles that keep its tensors alive, and the
        # caching allocator keeps their blocks: free both before the next case.
        gc.collect()
        torch.cuda.empty_cache()


def matmul_tflops(dtype, max_size, probe, repeats, device, slow_call_ms=100):
    """The machine's matmul rate in dtype: median TFLOP/s of an (n x n) @ (n x n) product, the
    ceiling attention's two tile products work against. Returns (tflops, n).

    n doubles from 256 up to max_size while one product takes under slow_call_ms, so a dtype
    the machine multiplies slowly (bf16 without native support: under 1 GFLOP/s) costs
    seconds, not minutes."""
    size = min(256, max_size)
    while True:
        a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
        first_ms = probe.time_ms(lambda: a @ b)  # also the warm-up: BLAS handles, page faults
        if size * 2 > max_size or first_ms > slow_call_ms:
            break
        size *= 2
    median_ms = statistics.median(probe.time_ms(lambda: a @ b) for _ in range(repeats))
    return 2 * size ** 3 / (median_ms / MS_PER_S) / 1e12, size


class CopyStep:
    """The machine's memory bandwidth as a large tensor copy sees it, as a step to time:
    dst.copy_(src) of nbytes. gb_per_s(ms) counts bytes read + written (STREAM's convention for
    copy; the write-allocate reads of the destination are not counted)."""

    def __init__(self, nbytes, device):
        self.nbytes = nbytes
        self.src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        self.dst = torch.zeros_like(self.src)

    def __call__(self):
        return self.dst.copy_(self.src)

    def gb_per_s(self, ms):
        return 2 * self.nbytes / (ms / MS_PER_S) / 1e9


class ReadStep:
    """The machine's read bandwidth as a large reduction sees it, as a step to time: the sum of
    nbytes of float32. gb_per_s(ms) counts the bytes read. A decode step only reads its cache,
    and a copy's writes can cost as much as its reads (a 2-vCPU Xeon VM: reads 38 GB/s, a copy
    21-23 GB/s counting both), so a decode can beat the copy and is measured against this too."""

    def __init__(self, nbytes, device):
        self.nbytes = nbytes - nbytes % 4
        self.values = torch.ones(self.nbytes // 4, dtype=torch.float32, device=device)

    def __call__(self):
        return self.values.sum()

    def gb_per_s(self, ms):
        return self.nbytes / (ms / MS_PER_S) / 1e9


def copy_bandwidth(copy, probe, repeats):
    """[GB/s of each of `repeats` timed copies] (a CopyStep or a ReadStep), after one warm-up
    (page faults); the caller takes the median."""
    probe.time_ms(copy)
    return [copy.gb_per_s(probe.time_ms(copy)) for _ in range(repeats)]


def cpu_tile_products_tflops(dtype, head_dim, seconds):
    """The rate of flashattn's own forward tile products on the CPU, on a hot tile (operands in
    cache): one key block's Q·Kᵀ and P·V (128 queries x 128 keys x head_dim, 2 FLOPs per
    multiply-add), made as the forward makes them, over and over on every thread at once for
    `seconds` (each thread's median over 20 ms windows, summed). Returns [(what ran, TFLOP/s,
    whether dtype's attention takes it now)]: the fp32 products for every dtype, and for
    bf16/fp16 also the 16-bit ones (the kernel their 16-bit path would use). It is the ceiling
    the forward's tiling works against: the rest of the forward's time is the softmax, the
    packing and the tiling."""
    internal = torch.ops.flashattn_internal
    paths = ["fp32"]
    taken = "fp32"
    if dtype in (torch.bfloat16, torch.float16):
        paths.append("16bit")
        taken = "16bit" if internal.cpu_16bit_path(dtype)[1] else "fp32"
    rates = []
    for path in paths:
        gflops, what = internal.cpu_tile_products_gflops(dtype, head_dim, path, seconds)
        rates.append((what, gflops / 1e3, path == taken))
    return rates


def warm_up_check_and_profile(result, step, check, probe, warmup):
    """Calls step() warmup times, then fills result.max_err and result.dq_err from
    check(out, grads) -> (max_err, dq_err or None) and result.peak_mb from one more call.
    Returns why the implementation cannot run (its error and SDPA's warnings), or None."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # SDPA says why it rejects a backend only in warnings
        try:
            for _ in range(warmup):
                out, grads = step()
            result.max_err, result.dq_err = check(out, grads)
            del out, grads
            result.peak_mb = probe.peak_extra_mb(step)
        except (RuntimeError, MemoryError) as err:  # NotImplementedError and OOM included
            return "; ".join(first_line(e) for e in [err, *(w.message for w in caught)])
    return None


def time_in_alternation(steps, probe, repeats):
    """{name: [ms, ...]}: each repeat calls every step once, back to back."""
    names = list(steps)
    times = {name: [] for name in names}
    for repeat in range(repeats if names else 0):
        # Rotating who goes first spreads order effects (caches, clocks) over all of them.
        first = repeat % len(names)
        for name in names[first:] + names[:first]:
            times[name].append(probe.time_ms(steps[name]))
    return times


def check_then_time(candidates, probe, settings, not_available, companions=None, timing=None):
    """Every bench mode's measurement of one case. candidates: [(name, result, step, check)];
    each step is warmed up, checked and profiled (warm_up_check_and_profile), and one that
    cannot run gets result.status = not_available with its reason and no timing. The others
    are timed in alternation, and each result gets its samples and their median. companions:
    {name: step} timed in the same rotation, neither checked nor given a result (a yardstick
    that the results are compared with repeat by repeat, as a CopyStep for the bandwidth).
    timing: ({name: step}) -> {name: [ms, ...]}, samples paired by index; by default
    time_in_alternation with settings.repeats.
    Returns ({name: result}, {name: [ms, ...]} of those timed, companions included)."""
    results, runnable = {}, {}
    for name, result, step, check in candidates:
        reason = warm_up_check_and_profile(result, step, check, probe, settings.warmup)
        if reason:
            result.status, result.reason = not_available, reason
            probe.after_failure()
        else:
            runnable[name] = step
        results[name] = result
    steps = {**runnable, **(companions or {})}
    times = (timing(steps) if timing
             else time_in_alternation(steps, probe, settings.repeats))
    for name, samples in times.items():
        if name not in results:
            continue  # a companion
        results[name].times_ms, results[name].time_ms = samples, statistics.median(samples)
    return results, times


def paired_speedup(samples, baseline):
    """Median over the repeats of t / t_baseline, for calls made back to back: > 1, the
    baseline is faster."""
    return statistics.median(t / t_base for t, t_base in zip(samples, baseline))


def first_line(message):
    return str(message).strip().splitlines()[0] if str(message).strip() else type(message).__name__


def make_probe(device):
    return CudaProbe(device) if device.type == "cuda" else CpuProbe()


def memory_meta(probe):
    """For the report of a subcommand that measures peak memory: how, and why not where it
    could not."""
    return {"peak_memory": probe.memory_method, "peak_memory_unavailable": probe.memory_note}


def _can_reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write(_RESET_PEAK_RSS)
        _proc_status_kb("VmHWM")
        return True
    except (OSError, ValueError):
        return False


def _proc_status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise ValueError(f"{field} missing from /proc/self/status")


def _return_free_heap_to_os():
    # glibc keeps freed blocks mapped (its mmap threshold grows after big frees), so the next
    # call could reuse resident pages and look free of cost. malloc_trim hands them back.
    libc = ctypes.CDLL(None)
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)



@dataclass
class ReferenceRows:
    """Float64 reference output (and dq) for one block of query rows, layout (B, H, rows, D)."""
    rows: slice
    out: torch.Tensor
    dq: torch.Tensor = None


def checked_row_blocks(seqlen):
    """(rows, align_bottom_right) pairs whose causal diagonal the reference places correctly.

    The bench uses seqlen_q == seqlen_k, where query i sees key j <= i. A block of rows starting
    at 0 gets that from the top-left alignment; a block ending at seqlen from the bottom-right.
    """
    if seqlen <= 2 * CHECKED_ROWS_PER_END:
        return [(slice(0, seqlen), False)]
    return [(slice(0, CHECKED_ROWS_PER_END), False),
            (slice(seqlen - CHECKED_ROWS_PER_END, seqlen), True)]


def reference_rows(q, k, v, dout, causal, with_dq):
    """Float64 reference for the checked rows; q, k, v, dout in (B, H, S, D) layout."""
    # attention_reference takes (B, S, H, D): transposing is a view, the cast makes the copy.
    k64, v64 = (t.detach().transpose(1, 2).double() for t in (k, v))
    blocks = []
    for rows, align_bottom_right in checked_row_blocks(q.shape[2]):
        q64 = q.detach()[:, :, rows].transpose(1, 2).double().requires_grad_(with_dq)
        with torch.enable_grad():
            out, _ = attention_reference(q64, k64, v64, causal=causal,
                                         align_bottom_right=align_bottom_right)
        dq = None
        if with_dq:
            # Row i of dq depends only on row i of q and dout, so a row block is exact.
            (dq,) = torch.autograd.grad(out, q64, dout[:, :, rows].transpose(1, 2).double())
            dq = dq.transpose(1, 2)
        blocks.append(ReferenceRows(rows, out.detach().transpose(1, 2), dq))
    return blocks


def max_error(tensor, blocks, field):
    """max |tensor - reference| over the checked rows; field is "out" or "dq"."""
    errors = [(tensor[:, :, b.rows].double() - getattr(b, field)).abs().max().item()
              for b in blocks]
    return max(errors)
