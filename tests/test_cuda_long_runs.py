"""Long runs and concurrency on a GPU (issue 34): many calls of each public function return
torch.cuda.memory_allocated to its baseline (no device memory kept per call, on success or on
error), and calls spread over two streams give bit for bit the results of the same calls on
one.

The calls are test_long_runs.py's (every public function cycling through its variants, the
backward included, and malformed calls that raise after allocating), made with CUDA tensors.
FLASHATTN_CUDA_LONG_RUN_CALLS sets the calls per function (default 1000).

Needs a CUDA device (tools/gpu_check.sh runs it); the CPU's side is test_long_runs.py and
test_concurrency.py."""
import gc
import os

import pytest
import torch

import flashattn
import test_long_runs as long_runs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU on this machine")

CALLS = int(os.environ.get("FLASHATTN_CUDA_LONG_RUN_CALLS", 1000))
WARMUP = 50


def allocated_after(calls, count):
    for i in range(count):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    gc.collect()
    return torch.cuda.memory_allocated()


@pytest.mark.parametrize("name", long_runs.FUNCTIONS)
def test_cuda_memory_returns_to_its_baseline(name):
    with torch.device("cuda"):  # every tensor the calls hold is made on the GPU
        calls = long_runs.make_calls(name)
    baseline = allocated_after(calls, WARMUP)
    after = allocated_after(calls, CALLS)
    assert after == baseline, (f"{name}: torch.cuda.memory_allocated grew by {after - baseline} "
                               f"bytes over {CALLS} calls after warm-up")


def cases(q, k, v):
    """Deterministic calls (no dropout; the backward's deterministic dQ), each -> its tensors."""
    def forward(**kw):
        return lambda: (flashattn.flash_attn_func(q, k, v, **kw),)

    def forward_backward(**kw):
        def call():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = flashattn.flash_attn_func(*leaves, deterministic=True, **kw)
            return (out, *torch.autograd.grad(out, leaves, torch.ones_like(out)))
        return call

    return [forward(), forward(causal=True), forward(window_size=(96, 0)), forward(softcap=30.0),
            forward_backward(), forward_backward(causal=True)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_cuda_two_streams_give_the_results_of_one(dtype):
    torch.manual_seed(0)
    q = torch.randn(2, 333, 8, 64, device="cuda", dtype=dtype)
    k, v = (torch.randn(2, 301, 4, 64, device="cuda", dtype=dtype) for _ in range(2))
    calls = cases(q, k, v)
    expected = [call() for call in calls]  # the current stream, one after another
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    got = []
    for i in range(4 * len(calls)):  # interleaved: stream 0 and 1 take turns
        with torch.cuda.stream(streams[i % 2]):
            got.append(calls[i % len(calls)]())
    torch.cuda.synchronize()
    for i, tensors in enumerate(got):
        for n, (a, b) in enumerate(zip(tensors, expected[i % len(calls)])):
            assert torch.equal(a, b), f"call {i % len(calls)}, tensor {n}, on stream {i % 2}"
