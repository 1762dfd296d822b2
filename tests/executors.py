"""The executors the correctness checks run on.

cpu   torch.ops.flashattn on CPU tensors (the CPU kernels)
cuda  torch.ops.flashattn on CUDA tensors; skipped without a GPU
sim   torch.ops.flashattn_sim on CPU tensors: the CUDA kernels' own source on the CPU shim
      (tests/cudasim), built by tests/sim_ext/build.py on first use; skipped without the CUDA
      headers. Every CUDA thread is a fiber, so it only affords small sizes: it is not in
      EXECUTORS, and test_cuda_kernels_sim.py runs it through the same checks at its own sizes.
"""
import functools
import json

import pytest
import torch

# The executors of the big matrices in test_forward.py and test_backward.py.
EXECUTORS = ["cpu", "cuda"]


class Executor:
    def __init__(self, name, device, ops):
        self.name, self.device, self.ops = name, device, ops

    # The ops' arguments by name (csrc/schema.h); window=(left, right) is the one shorthand.
    def fwd(self, q, k, v, softmax_scale, window=(-1, -1), **arguments):
        return self.ops.fwd(q, k, v, softmax_scale=softmax_scale, window_left=window[0],
                            window_right=window[1], **arguments)

    def bwd(self, dout, q, k, v, out, lse, dlse, softmax_scale, window=(-1, -1), **arguments):
        """(dq, dk, dv), and attn_mask's gradient too when attn_mask_grad=True."""
        *grads, dmask = self.ops.bwd(dout=dout, out=out, lse=lse, dlse=dlse, q=q, k=k, v=v,
                                     softmax_scale=softmax_scale, window_left=window[0],
                                     window_right=window[1], **arguments)
        return (*grads, dmask) if arguments.get("attn_mask_grad") else tuple(grads)


class SimExecutor(Executor):
    def set_schedule(self, schedule):
        """The order the shim runs warps in between barriers, for every later launch:
        "forward", "reverse" or "random:SEED"."""
        self.ops.set_schedule(schedule)

    def counted(self, fn):
        """fn()'s result and the shim's counters of the launches fn made, as a dict ("launches":
        one entry per launch, with its kernel name and counters): counting is on only during
        fn, from zero, and the counters are reset afterwards."""
        self.ops.counters_enable(False)
        self.ops.counters_reset()
        self.ops.counters_enable(True)
        try:
            result = fn()
        finally:
            self.ops.counters_enable(False)
        counters = json.loads(self.ops.counters_json())
        self.ops.counters_reset()
        return result, counters

    def launches(self, fn, kernel=""):
        """fn()'s result and its launches whose kernel name contains `kernel`."""
        result, counters = self.counted(fn)
        return result, [launch for launch in counters["launches"] if kernel in launch["kernel"]]


@functools.cache
def _load_sim_ops():
    """Builds the sim extension (or reuses torch's cached build) once per process. The library
    reads FLASHATTN_POISON_OUTPUTS when it loads; conftest.py sets it before any test runs.
    A skip or a failed build is not cached: callers that must not retry it per test hold the
    executor in a module-scoped fixture, as test_cuda_kernels_sim.py does."""
    from sim_ext import build  # tests/ is on sys.path, as for this module

    if build.cudasim_build.cuda_include_dir() is None:
        pytest.skip("the sim executor compiles the CUDA kernels against cuda_fp16.h and "
                    "vector_types.h: set CUDA_HOME to a CUDA toolkit")
    build.load()
    return torch.ops.flashattn_sim


def make_executor(name):
    if name == "cpu":
        return Executor("cpu", torch.device("cpu"), torch.ops.flashattn)
    if name == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU on this machine")
        return Executor("cuda", torch.device("cuda"), torch.ops.flashattn)
    if name == "sim":
        return SimExecutor("sim", torch.device("cpu"), _load_sim_ops())
    raise ValueError(name)
