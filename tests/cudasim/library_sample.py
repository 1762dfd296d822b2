"""What the library's GPU samples share (hopper_library_sample.py, hopper_library_bwd_sample.py):
which kernels a call launched, PASS / FAIL lines with a failure count, a TFLOP/s figure, and the
main that runs them on an sm_90 GPU with FLASHATTN_CUDA_HOPPER=1."""
import contextlib
import os
import time

import torch


def kernels_run(fn):
    """The CUDA kernel names fn() launches, from the profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def assert_ran(names, kernel, what):
    """That a launched kernel's name holds `kernel`; the message names `what` and what ran."""
    assert any(kernel in n for n in names), f"no {what} ran: {names}"


class Tally:
    """`with tally.case(name):` prints PASS name, or FAIL name: why on an AssertionError, which
    it counts in tally.failures and does not raise."""

    def __init__(self):
        self.failures = 0

    @contextlib.contextmanager
    def case(self, name):
        try:
            yield
        except AssertionError as e:
            self.failures += 1
            print(f"FAIL {name}: {e}")
        else:
            print(f"PASS {name}")


def tflops(step, flop, iters):
    """flop / (mean wall seconds of step() over `iters` calls, after 3 warm-up calls) in TFLOP/s."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return flop / ((time.perf_counter() - start) / iters) / 1e12


def run_sample(check_cases, benchmarks):
    """A sample's main: SKIP (exit 0) off compute capability 9.0, exit 1 without
    FLASHATTN_CUDA_HOPPER=1; else check_cases(tally), then one line per (label, TFLOP/s function)
    of benchmarks; exit 1 on any failure."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("SKIP: needs a GPU of compute capability 9.0 (sm_90a)")
        return 0
    if os.environ.get("FLASHATTN_CUDA_HOPPER") != "1":
        print("FAIL: run with FLASHATTN_CUDA_HOPPER=1 (the library reads it once per process)")
        return 1
    import flashattn  # noqa: F401  (registers torch.ops.flashattn)
    tally = Tally()
    check_cases(tally)
    for label, measure in benchmarks:
        print(f"{label}: {measure():.0f} TFLOP/s")
    print(f"{'FAIL' if tally.failures else 'PASS'}: {tally.failures} failure(s)")
    return 1 if tally.failures else 0
