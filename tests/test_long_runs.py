"""Long runs (issue 34): many calls of each public function on the CPU keep the process's
resident memory flat -- no leak per call, on success or on error.

The functions run one after another in a fresh subprocess (this file as a script), each with
its own warm-up calls, then RSS from /proc/self/statm, then CALLS more calls (cycling through variants: GQA, causal, window,
softcap, ALiBi, dropout, seqused, attn_mask, paged / dense caches with appends and rotary,
return_attn_probs, and for the differentiable ones the backward too), then RSS again. The
growth must stay under 1 MB. "malformed" makes calls that raise in the op's checks (after some
have allocated), to catch a leak on the error path.

CI runs 1000 calls per function (FLASHATTN_LONG_RUN_CALLS), with one intra-op thread
(FLASHATTN_LONG_RUN_THREADS); the issue's figure is 10,000:

    FLASHATTN_LONG_RUN_CALLS=10000 python -m pytest tests/test_long_runs.py -p no:cacheprovider -q -s

or by hand (comma-separated functions, calls): python tests/test_long_runs.py flash_attn_func 10000
"""
import gc
import json
import os
import subprocess
import sys

CALLS = int(os.environ.get("FLASHATTN_LONG_RUN_CALLS", 1000))
# Intra-op threads of the subprocess: 1 by default, as the CPUs of a shared CI machine make a
# spinning OpenMP team slow by 10-100x; the concurrency test covers threads.
THREADS = int(os.environ.get("FLASHATTN_LONG_RUN_THREADS", 1))
WARMUP = 200
LIMIT_BYTES = 1 << 20

FUNCTIONS = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
             "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
             "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache",
             "scaled_dot_product_attention", "malformed"]


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_calls(name):
    """A list of zero-argument callables, each one call (and its backward) of `name`."""
    import torch

    import flashattn

    torch.manual_seed(0)

    def rnd(*shape, grad=False):
        return torch.randn(*shape).requires_grad_(grad)

    calls = []
    if name == "flash_attn_func":
        q, k, v = rnd(2, 33, 4, 16, grad=True), rnd(2, 40, 2, 16, grad=True), rnd(2, 40, 2, 16, grad=True)
        slopes = torch.rand(4)
        for kw in [{}, dict(causal=True), dict(window_size=(8, 3)), dict(softcap=5.0),
                   dict(alibi_slopes=slopes), dict(dropout_p=0.2), dict(return_attn_probs=True),
                   dict(dropout_p=0.1, return_attn_probs=True, deterministic=True)]:
            calls.append(lambda kw=kw: _backward(flashattn.flash_attn_func(q, k, v, **kw)))
    elif name == "flash_attn_qkvpacked_func":
        qkv = rnd(2, 33, 3, 4, 16, grad=True)
        for kw in [{}, dict(causal=True), dict(dropout_p=0.1)]:
            calls.append(lambda kw=kw: _backward(flashattn.flash_attn_qkvpacked_func(qkv, **kw)))
    elif name == "flash_attn_kvpacked_func":
        q, kv = rnd(2, 17, 4, 16, grad=True), rnd(2, 29, 2, 2, 16, grad=True)
        for kw in [{}, dict(causal=True), dict(softcap=3.0)]:
            calls.append(lambda kw=kw: _backward(flashattn.flash_attn_kvpacked_func(q, kv, **kw)))
    elif name.startswith("flash_attn_varlen"):
        lengths = [0, 5, 33, 1]
        cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        total, mx = sum(lengths), max(lengths)
        if name == "flash_attn_varlen_func":
            q, k, v = rnd(total, 4, 16, grad=True), rnd(total, 2, 16, grad=True), rnd(total, 2, 16, grad=True)
            used = torch.tensor([0, 3, 30, 1], dtype=torch.int32)
            for kw in [{}, dict(causal=True), dict(seqused_k=used), dict(dropout_p=0.1)]:
                calls.append(lambda kw=kw: _backward(flashattn.flash_attn_varlen_func(
                    q, k, v, cu, cu, mx, mx, **kw)))
            kc, vc = rnd(20, 4, 2, 16), rnd(20, 4, 2, 16)
            table = torch.randperm(20).repeat(2)[:36].view(4, 9).to(torch.int32)
            calls.append(lambda: flashattn.flash_attn_varlen_func(
                q.detach(), kc, vc, cu, cu, mx, mx, block_table=table))
        elif name == "flash_attn_varlen_qkvpacked_func":
            qkv = rnd(total, 3, 4, 16, grad=True)
            for kw in [{}, dict(causal=True)]:
                calls.append(lambda kw=kw: _backward(flashattn.flash_attn_varlen_qkvpacked_func(
                    qkv, cu, mx, **kw)))
        else:
            q, kv = rnd(total, 4, 16, grad=True), rnd(total, 2, 2, 16, grad=True)
            for kw in [{}, dict(window_size=(4, 0))]:
                calls.append(lambda kw=kw: _backward(flashattn.flash_attn_varlen_kvpacked_func(
                    q, kv, cu, cu, mx, mx, **kw)))
    elif name == "flash_attn_with_kvcache":
        q = rnd(3, 1, 4, 16)
        kc, vc = rnd(3, 64, 2, 16), rnd(3, 64, 2, 16)
        pk, pv = rnd(30, 7, 2, 16), rnd(30, 7, 2, 16)
        table = torch.randperm(30)[:27].view(3, 9).to(torch.int32)
        knew, vnew = rnd(3, 2, 2, 16), rnd(3, 2, 2, 16)
        cos, sin = rnd(70, 4), rnd(70, 4)
        seqlens = torch.tensor([0, 17, 60], dtype=torch.int32)
        calls += [
            lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens),
            lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, knew, vnew, cache_seqlens=seqlens,
                                                      causal=True, num_splits=3),
            lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, knew, vnew, rotary_cos=cos,
                                                      rotary_sin=sin, cache_seqlens=seqlens,
                                                      return_softmax_lse=True),
            lambda: flashattn.flash_attn_with_kvcache(
                q, kc, vc, knew, vnew, cache_seqlens=seqlens,
                cache_batch_idx=torch.tensor([2, 0, 1], dtype=torch.int32),
                cache_leftpad=torch.tensor([0, 3, 1], dtype=torch.int32)),
            lambda: flashattn.flash_attn_with_kvcache(q, pk, pv, knew, vnew, cache_seqlens=seqlens,
                                                      block_table=table, num_splits=0),
        ]
    elif name == "scaled_dot_product_attention":
        q, k, v = rnd(2, 4, 33, 16, grad=True), rnd(2, 2, 40, 16, grad=True), rnd(2, 2, 40, 16, grad=True)
        mask = torch.rand(33, 40) > 0.3
        fmask = rnd(2, 1, 33, 40, grad=True)
        for kw in [dict(enable_gqa=True), dict(enable_gqa=True, is_causal=True),
                   dict(enable_gqa=True, attn_mask=mask), dict(enable_gqa=True, attn_mask=fmask),
                   dict(enable_gqa=True, dropout_p=0.1, scale=0.3)]:
            calls.append(lambda kw=kw: _backward(flashattn.scaled_dot_product_attention(
                q, k, v, **kw)))
    elif name == "malformed":
        q, k = rnd(2, 9, 4, 16), rnd(2, 9, 2, 16)
        kc = rnd(2, 16, 2, 16)
        bad = [
            lambda: flashattn.flash_attn_func(q, k, k[:, :5]),  # v's seqlen is not k's
            lambda: flashattn.flash_attn_func(q, k, k, window_size=(1, 2, 3)),
            lambda: flashattn.flash_attn_varlen_func(
                q[0], k[0], k[0], torch.tensor([0, 9, 3], dtype=torch.int32),
                torch.tensor([0, 4, 9], dtype=torch.int32), 9, 9),
            lambda: flashattn.flash_attn_with_kvcache(
                q[:, :1], kc, kc, k[:, :1], k[:, :1], cache_seqlens=torch.tensor([1, 2], dtype=torch.int32)),
            lambda: flashattn.flash_attn_with_kvcache(
                q[:, :1], kc, kc.clone(), cache_seqlens=torch.tensor([1, 99], dtype=torch.int32)),
            lambda: flashattn.scaled_dot_product_attention(q, k, k, attn_mask=torch.ones(3, 3) > 0),
        ]

        def raising(f):
            def call():
                try:
                    f()
                except (RuntimeError, ValueError, TypeError, IndexError):
                    return
                raise AssertionError("a malformed call returned")
            return call
        calls = [raising(f) for f in bad]
    else:
        raise ValueError(name)
    return calls


def _backward(result):
    out = result[0] if isinstance(result, tuple) else result
    out.sum().backward()


def measure(name, calls_total):
    """(RSS after warm-up, RSS after calls_total more calls) of `name`, in this process."""
    import torch
    torch.set_num_threads(THREADS)
    calls = make_calls(name)
    for i in range(WARMUP):
        calls[i % len(calls)]()
    gc.collect()
    before = rss_bytes()
    for i in range(calls_total):
        calls[i % len(calls)]()
        if i % 1000 == 999:
            gc.collect()
    gc.collect()
    after = rss_bytes()
    return dict(function=name, calls=calls_total, threads=THREADS, rss_before=before,
                rss_after=after, growth=after - before, torch=torch.__version__)


def run_in_subprocess(names, calls_total):
    """measure() of each of `names` in turn, in one fresh process (one import of torch)."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), ",".join(names),
                           str(calls_total)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_many_calls_keep_rss_flat():
    results = run_in_subprocess(FUNCTIONS, CALLS)
    for r in results:
        print(json.dumps(r))
    assert [r["function"] for r in results] == FUNCTIONS
    grew = [r for r in results if r["growth"] >= LIMIT_BYTES]
    assert not grew, f"RSS grew by 1 MB or more over {CALLS} calls after warm-up: {grew}"


if __name__ == "__main__":
    for function in sys.argv[1].split(","):
        print(json.dumps(measure(function, int(sys.argv[2]))), flush=True)
