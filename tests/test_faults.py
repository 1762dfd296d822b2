"""Faults (issue 34): a request too large to allocate raises the allocator's error, and
flashattn stays usable, with no half-written result handed back.

Two ways to make an allocation fail on the CPU without using the memory for real:
  * a request beyond any machine: inputs expanded (stride 0) to shapes whose outputs need
    2^56 bytes (64 PiB): the allocator refuses it whatever the overcommit policy;
  * an address-space limit (RLIMIT_AS) in a subprocess whose malloc maps every block of 64 KiB
    or more afresh (MALLOC_MMAP_THRESHOLD_, so no freed memory serves it), swept from no
    headroom upwards in steps, so that in turn every allocation of a call -- outputs, LSE, gradients, the CPU
    kernels' workspaces, the rotated queries -- is the one that fails. Each call under a limit
    either returns exactly the result it gives without one (bitwise), or raises the
    allocator's error (torch.OutOfMemoryError / RuntimeError naming the allocation, or
    MemoryError); after each failure, the limit lifted, the next call is exact. A KV-cache
    call that raised has left each appended row either as it was or holding its new key /
    value, nothing else; a backward that raised has written no .grad.

The sweep stays below 48 MB of headroom (the machine never allocates more than that), in steps
of 512 KiB (FLASHATTN_FAULT_STEP: smaller steps, a finer sweep), and ends a call's sweep after
4 calls in a row fit.

    FLASHATTN_FAULT_STEP=16384 python -m pytest tests/test_faults.py -q    # every 16 KiB
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import flashattn

STEP = int(os.environ.get("FLASHATTN_FAULT_STEP", 512 * 1024))
MAX_HEADROOM = 48 * 1024 * 1024
ENOUGH = 4  # consecutive calls that fit end a function's sweep


def allocator_error(e):
    message = str(e)
    return (isinstance(e, MemoryError)
            or isinstance(e, RuntimeError) and ("memory" in message or "alloc" in message))


def test_a_petabyte_request_raises_the_allocators_error_and_the_next_call_works():
    small_q, small_k = torch.randn(1, 1, 1, 64), torch.randn(1, 1, 1, 64)
    big = 1 << 24  # batch and seqlen: outputs of 2^54 elements, 2^56 bytes
    q = small_q.expand(big, big, 1, 64)
    k = small_k.expand(big, 1, 1, 64)
    with pytest.raises(RuntimeError, match=r"(?i)(not enough memory|allocat)") as info:
        flashattn.flash_attn_func(q, k, k)
    assert str(1 << 56) in str(info.value), info.value  # the allocation it names
    with pytest.raises(RuntimeError, match=r"(?i)(not enough memory|allocat)"):
        flashattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               k.transpose(1, 2))
    q2, k2 = torch.randn(2, 9, 2, 16), torch.randn(2, 5, 1, 16)
    out = flashattn.flash_attn_func(q2, k2, k2)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q2.transpose(1, 2), k2.transpose(1, 2).expand(2, 2, 5, 16),
        k2.transpose(1, 2).expand(2, 2, 5, 16)).transpose(1, 2)
    torch.testing.assert_close(out, ref)


def test_a_kvcache_call_whose_outputs_cannot_be_allocated_leaves_the_cache_untouched():
    """The queries' outputs do not fit (q expanded to 2^31 - 1 queries of 2^16 heads, 2^56
    bytes of output): the call raises before it appends (fwd_kvcache allocates its outputs
    first, csrc/op_glue.h), so every cache row is unchanged."""
    q = torch.randn(1, 1, 1, 64).expand(2, (1 << 31) - 1, 1 << 16, 64)
    k_cache, v_cache = torch.randn(2, 8, 1, 64), torch.randn(2, 8, 1, 64)
    k_new, v_new = torch.randn(2, 1, 1, 64), torch.randn(2, 1, 1, 64)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    seqlens = torch.tensor([2, 5], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"(?i)(not enough memory|allocat)"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                          cache_seqlens=seqlens)
    assert torch.equal(k_cache, before_k)
    assert torch.equal(v_cache, before_v)


# ---------------------------------------------------------------------------- the sweep

def _calls():
    """name -> (setup() -> state, call(state) -> list of result tensors, check_after_error)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 24, 16, 1024, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 7, 7, 24], dtype=torch.int32)
    vq, vk, vv = (torch.randn(24, 16, 1024, requires_grad=True) for _ in range(3))
    sq, sk, sv = (torch.randn(1, 16, 24, 1024, requires_grad=True) for _ in range(3))
    fmask = torch.randn(1, 16, 24, 24, requires_grad=True)
    kq = torch.randn(2, 64, 16, 1024)
    k_cache, v_cache = torch.randn(2, 40, 4, 1024), torch.randn(2, 40, 4, 1024)
    k_new, v_new = torch.randn(2, 3, 4, 1024), torch.randn(2, 3, 4, 1024)
    cos, sin = torch.randn(100, 256), torch.randn(100, 256)
    seqlens = torch.tensor([0, 30], dtype=torch.int32)

    def grads(out, *leaves):
        for t in leaves:
            t.grad = None
        try:
            out.float().pow(2).sum().backward()
        except BaseException:
            assert all(t.grad is None for t in leaves), "a backward that raised wrote .grad"
            raise
        return [out.detach()] + [t.grad for t in leaves]

    def kvcache():
        kc, vc = k_cache.clone(), v_cache.clone()
        try:
            out = flashattn.flash_attn_with_kvcache(kq, kc, vc, k_new, v_new, rotary_cos=cos,
                                                    rotary_sin=sin, cache_seqlens=seqlens,
                                                    causal=True)
        except BaseException:
            # Appended rows old or new (the new key rotated: compared with the reference's),
            # every other row unchanged.
            _check_cache_after_error(kc, k_cache, vc, v_cache, seqlens, 3)
            raise
        return [out, kc, vc]

    return {
        "flash_attn_func fwd+bwd": lambda: grads(flashattn.flash_attn_func(q, k, v, causal=True),
                                                 q, k, v),
        "flash_attn_varlen_func fwd+bwd": lambda: grads(flashattn.flash_attn_varlen_func(
            vq, vk, vv, cu, cu, 17, 17), vq, vk, vv),
        "scaled_dot_product_attention fwd+bwd, float mask": lambda: grads(
            flashattn.scaled_dot_product_attention(sq, sk, sv, attn_mask=fmask), sq, sk, sv,
            fmask),
        "flash_attn_with_kvcache append+rotary": kvcache,
    }


_REFERENCE_CACHES = {}


def _check_cache_after_error(kc, k_cache, vc, v_cache, seqlens, new):
    ref_k, ref_v = _REFERENCE_CACHES["k"], _REFERENCE_CACHES["v"]
    for cache, before, after in ((kc, k_cache, ref_k), (vc, v_cache, ref_v)):
        for b, n in enumerate(seqlens.tolist()):
            for row in range(cache.shape[1]):
                got = cache[b, row]
                if n <= row < n + new:
                    assert torch.equal(got, before[b, row]) or torch.equal(got, after[b, row]), (
                        f"appended row {row} of sequence {b} half-written")
                else:
                    assert torch.equal(got, before[b, row]), f"row {row} of sequence {b} written"


def _vm_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _sweep(step, max_headroom):
    import resource

    torch.set_num_threads(1)
    calls = _calls()
    records = []
    for name, call in calls.items():
        reference = call()
        if name.startswith("flash_attn_with_kvcache"):
            _REFERENCE_CACHES["k"], _REFERENCE_CACHES["v"] = reference[1], reference[2]
        for _ in range(2):
            call()  # warm up every allocation cache
        failures = successes = streak = 0
        last_failure = None
        for headroom in range(0, max_headroom + 1, step):
            if streak == ENOUGH:
                break
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            error = None
            resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + headroom, hard))
            try:
                result = call()
            except BaseException as e:  # noqa: BLE001 - classified below, limit lifted first
                error = e
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
            if error is not None:
                last_failure = headroom
                if not allocator_error(error):
                    records.append(dict(name=name, headroom=headroom, problem="not the "
                                        f"allocator's error: {type(error).__name__}: {error}"))
                failures += 1
                streak = 0
                after = call()  # flashattn still usable, exact
                if not all(torch.equal(a, b) for a, b in zip(after, reference)):
                    records.append(dict(name=name, headroom=headroom,
                                        problem="the call after a failure differs"))
                continue
            successes += 1
            streak += 1
            if not all(torch.equal(a, b) for a, b in zip(result, reference)):
                records.append(dict(name=name, headroom=headroom,
                                    problem="a call under the limit returned a different result"))
        records.append(dict(name=name, failures=failures, successes=successes,
                            last_failure_headroom=last_failure))
    return records


def test_every_allocation_failing_in_turn_raises_and_leaves_flashattn_usable():
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(STEP),
                           str(MAX_HEADROOM)], capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0, (f"the sweep's process died (exit {proc.returncode})\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    problems = [r for r in records if "problem" in r]
    assert not problems, problems
    summary = [r for r in records if "failures" in r]
    assert len(summary) == 4, records
    for r in summary:
        print(json.dumps(r))
        # The sweep reached both: calls that failed to allocate, and calls with enough room.
        assert r["failures"] > 0 and r["successes"] > 0, r


if __name__ == "__main__":
    for record in _sweep(int(sys.argv[1]), int(sys.argv[2])):
        print(json.dumps(record), flush=True)
