"""Memory grows with N, not N^2: forward+backward at long sequence lengths on the CPU, measured
as the rise of the process's peak RSS in a fresh subprocess; and the forward holds packed K and V
for a few heads at a time, not all."""
import json
import subprocess
import sys

import pytest
import torch

import flashattn

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
    heads, not all 12 (or 6 kv heads with GQA), and the output does not depend on it."""
    torch.manual_seed(0)
    internal = torch.ops.flashattn_internal
    q = torch.randn(2, 300, 12, 40, dtype=dtype)
    outs = {}
    before = torch.get_num_threads()
    try:
        for heads_kv in (12, 6):
            k, v = (torch.randn(2, 300, heads_kv, 40, dtype=dtype) for _ in range(2))
            for n in (threads, 1):
                torch.set_num_threads(n)
                outs[n] = flashattn.flash_attn_func(q, k, v, causal=causal)
                if n == threads:
                    peak = internal.cpu_fwd_packed_heads_peak()
            assert 1 <= peak <= 2 * threads - 1, (heads_kv, peak)
            assert torch.equal(outs[threads], outs[1])
    finally:
        torch.set_num_threads(before)
