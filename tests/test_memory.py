"""Memory grows with N, not N^2: forward+backward at long sequence lengths on the CPU, measured
as the rise of the process's peak RSS in a fresh subprocess, and near SDPA-CPU's; the forward
holds packed K and V for a few heads at a time, and the backward its operands for one head per
thread, not all."""
import json
import subprocess
import sys

import pytest
import torch

import flashattn
from cpu_test_ext.build import ops as cpu_test_ops

MEASURE = r"""
import json, sys, torch, flashattn

def rss_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))

seqlen, heads, head_dim = map(int, sys.argv[1:4])
q, k, v = (torch.randn(1, seqlen, heads, head_dim).requires_grad_() for _ in range(3))
dout = torch.randn(1, seqlen, heads, head_dim)
baseline = rss_kb("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM (the peak) to the current RSS
out = flashattn.flash_attn_func(q, k, v, causal=False)
out.backward(dout)
peak = rss_kb("VmHWM:")
print(json.dumps({"rise_mb": (peak - baseline) / 1024, "finite": bool(q.grad.isfinite().all())}))
"""


def peak_rss_rise_mb(seqlen, heads, head_dim):
    result = subprocess.run([sys.executable, "-c", MEASURE, str(seqlen), str(heads), str(head_dim)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["finite"]
    return report["rise_mb"]


@pytest.mark.parametrize("seqlen,heads,limit_mb", [(16384, 1, 300), (32768, 2, 512)])
def test_forward_backward_memory_is_linear(seqlen, heads, limit_mb):
    # One fp32 score matrix alone would be seqlen^2 * 4 bytes: 1 GiB at 16k, 4 GiB at 32k.
    rise = peak_rss_rise_mb(seqlen, heads, 64)
    print(f"seqlen={seqlen} heads={heads}: peak RSS rose {rise:.0f} MB (limit {limit_mb} MB)")
    assert rise < limit_mb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_forward_packs_a_few_heads_at_a_time(threads, causal, dtype):
    """The forward packs each kv head's K and V when its first task needs them and frees them
    after its last (head_operands.h), the tasks queued in groups of as many heads as threads:
    at most the group being worked on and the unfinished tasks of the one before hold packed
    heads, not all 12 (or 6 kv heads with GQA), and the output does not depend on it. The peak
    is kept by the test-only build of the kernels only (tests/cpu_test_ext), so the calls go
    through its ops."""
    torch.manual_seed(0)
    ops = cpu_test_ops()
    q = torch.randn(2, 300, 12, 40, dtype=dtype)
    outs = {}
    before = torch.get_num_threads()
    try:
        for heads_kv in (12, 6):
            k, v = (torch.randn(2, 300, heads_kv, 40, dtype=dtype) for _ in range(2))
            for n in (threads, 1):
                torch.set_num_threads(n)
                outs[n], _ = ops.fwd(q, k, v, causal=causal)
                if n == threads:
                    peak = ops.cpu_fwd_packed_heads_peak()
            assert 1 <= peak <= 2 * threads - 1, (heads_kv, peak)
            assert torch.equal(outs[threads], outs[1])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_backward_packs_one_head_per_thread(threads, causal, dtype):
    """The backward packs each (sequence, kv head)'s operands and makes room for its chunks'
    partial dQ when its first task starts, and passes the memory on after its last task
    (head_operands.h); the tasks are queued head by head and a task lets go of its head before it
    claims the next, so at most one head per thread is held (of 2 x 12, 2 x 6 or 2 x 1), and the
    gradients do not depend on it. Through the test-only build's ops, as above."""
    torch.manual_seed(0)
    ops = cpu_test_ops()
    q = torch.randn(2, 300, 12, 40, dtype=dtype)
    dout = torch.randn(2, 300, 12, 40, dtype=dtype)
    before = torch.get_num_threads()
    try:
        for heads_kv in (12, 6, 1):
            k, v = (torch.randn(2, 300, heads_kv, 40, dtype=dtype) for _ in range(2))
            out, lse = ops.fwd(q, k, v, causal=causal)
            grads = {}
            for n in (threads, 1):
                torch.set_num_threads(n)
                grads[n] = ops.bwd(dout, out, lse, None, q, k, v, causal=causal)[:3]
                if n == threads:
                    peak = ops.cpu_bwd_packed_heads_peak()
            assert 1 <= peak <= threads, (heads_kv, peak)
            for mine, alone in zip(grads[threads], grads[1]):
                assert torch.equal(mine, alone)
    finally:
        torch.set_num_threads(before)


MEASURE_AGAINST_SDPA = r"""
import json, sys, torch, torch.nn.functional as F, flashattn
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashattn.bench.measure import CpuProbe

impl, dtype = sys.argv[1], getattr(torch, sys.argv[2])
torch.set_num_threads(2)
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2048, 8, 64, dtype=dtype).requires_grad_() for _ in range(3))
dout = torch.randn(1, 2048, 8, 64, dtype=dtype)

def flash():
    flashattn.flash_attn_func(q, k, v).backward(dout)

def sdpa():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    out.transpose(1, 2).backward(dout)

step = flash if impl == "flashattn" else sdpa
step()  # warm-up: one-time allocations (thread pools, oneDNN) are not the call's
for t in (q, k, v):
    t.grad = None
print(json.dumps({"peak_mb": CpuProbe().peak_extra_mb(step)}))
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_backward_memory_is_near_sdpa(dtype):
    """flashattn's forward+backward holds little more than SDPA-CPU's flash kernel above the
    inputs (the output, the gradients and what each keeps on the side), each measured in a fresh
    process (H 8, N 2048, d 64, 2 threads). docs/lab/2026-12-01-backward-memory-row-prefetch.md
    has the numbers (issue 16's target is 1.25x: on a Zen 4, 1.19x in fp32 and 1.20x in bf16
    here). bf16 on a CPU without vdpbf16ps or AMX takes fp32 products, which pack 4 more fp32
    copies of the operands (1.43x with FLASHATTN_CPU_16BIT_PRODUCTS=0 there), hence 1.6x;
    packing every head up front, as before, fails it (2.5x in fp32, 3.3x in bf16)."""
    rise = {}
    for impl in ("flashattn", "sdpa"):
        result = subprocess.run([sys.executable, "-c", MEASURE_AGAINST_SDPA, impl, dtype],
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        rise[impl] = json.loads(result.stdout.strip().splitlines()[-1])["peak_mb"]
    print(f"{dtype}: peak RSS rise flashattn {rise['flashattn']:.1f} MB, SDPA {rise['sdpa']:.1f}")
    assert rise["sdpa"] > 0
    assert rise["flashattn"] <= 1.6 * rise["sdpa"]
