"""Concurrency (issue 34): 8 Python threads calling the public functions at once, each with its
own shapes and features, get results bitwise equal to the same calls made one after another.

The op releases the GIL, so the calls really overlap, each with its own intra-op thread team.
Every call's outputs, LSE, gradients and (for KV-cache appends) the caches it wrote are
compared bit for bit. Dropout is left out: its seed comes from the default generator, which
concurrent calls draw from in whichever order they run (each call's mask is still a function
of its own seed, test_dropout.py).

    FLASHATTN_CONCURRENCY_ROUNDS=50 python -m pytest tests/test_concurrency.py -q   # longer
"""
import os
import threading

import torch

import flashattn

THREADS = 8
ROUNDS = int(os.environ.get("FLASHATTN_CONCURRENCY_ROUNDS", 3))


def _grads(out, *inputs):
    out = out[0] if isinstance(out, tuple) else out
    grads = torch.autograd.grad(out.float().pow(2).sum(), inputs)
    return [out.detach(), *grads]


def make_calls(seed):
    """Zero-argument callables returning lists of tensors, one per feature mix; seed picks the
    shapes, so each thread's calls differ from the others'."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, dtype=torch.float32, grad=False):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)

    s = 5 + seed % 7  # per-thread sequence lengths
    dtype = [torch.float32, torch.bfloat16, torch.float16, torch.float64][seed % 4]
    q, k, v = (rnd(2, s + 60, 4, 32, dtype=dtype, grad=True),
               rnd(2, 2 * s + 70, 2, 32, dtype=dtype, grad=True),
               rnd(2, 2 * s + 70, 2, 32, dtype=dtype, grad=True))
    slopes = torch.rand(4, generator=g)
    lengths = [s, 0, 3 * s, 1]
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    vq, vk, vv = (rnd(sum(lengths), 4, 16, grad=True), rnd(sum(lengths), 2, 16, grad=True),
                  rnd(sum(lengths), 2, 16, grad=True))
    sq, sk, sv = rnd(1, 4, s + 9, 24, grad=True), rnd(1, 4, s + 31, 24, grad=True), rnd(
        1, 4, s + 31, 24, grad=True)
    mask = torch.rand(s + 9, s + 31, generator=g) > 0.2
    kc, vc = rnd(3, 80, 2, 16), rnd(3, 80, 2, 16)
    pk, pv = rnd(40, 3, 2, 16), rnd(40, 3, 2, 16)
    table = torch.randperm(40, generator=g)[:39].view(3, 13).to(torch.int32)
    kq, knew, vnew = rnd(3, 2, 4, 16), rnd(3, 2, 2, 16), rnd(3, 2, 2, 16)
    cos, sin = rnd(90, 6), rnd(90, 6)
    seqlens = torch.tensor([s, 0, 30], dtype=torch.int32)

    def kvcache(paged, **kw):
        k_cache, v_cache = (pk.clone(), pv.clone()) if paged else (kc.clone(), vc.clone())
        out, lse = flashattn.flash_attn_with_kvcache(
            kq, k_cache, v_cache, knew, vnew, cache_seqlens=seqlens,
            block_table=table if paged else None, return_softmax_lse=True, **kw)
        return [out, lse, k_cache, v_cache]

    return [
        lambda: _grads(flashattn.flash_attn_func(q, k, v, causal=True), q, k, v),
        lambda: _grads(flashattn.flash_attn_func(q, k, v, window_size=(s, 2), softcap=4.0,
                                                 alibi_slopes=slopes, deterministic=True),
                       q, k, v),
        lambda: _grads(flashattn.flash_attn_varlen_func(vq, vk, vv, cu, cu, 3 * s, 3 * s,
                                                        causal=seed % 2 == 0), vq, vk, vv),
        lambda: _grads(flashattn.scaled_dot_product_attention(sq, sk, sv, attn_mask=mask,
                                                              scale=0.2), sq, sk, sv),
        lambda: kvcache(False, rotary_cos=cos, rotary_sin=sin, causal=True, num_splits=0),
        lambda: kvcache(True, num_splits=2),
        lambda: kvcache(False, cache_batch_idx=torch.tensor([2, 0, 1], dtype=torch.int32),
                        num_splits=1),
    ]


def bitwise_equal(a, b):
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.detach().contiguous().view(torch.uint8),
                            b.detach().contiguous().view(torch.uint8)))


def test_eight_threads_match_the_same_calls_made_one_after_another():
    calls = {t: make_calls(t) for t in range(THREADS)}
    sequential = {t: [c() for c in calls[t]] for t in range(THREADS)}
    results = {t: [] for t in range(THREADS)}
    errors = []
    barrier = threading.Barrier(THREADS)

    def worker(t):
        try:
            barrier.wait()
            for _ in range(ROUNDS):
                results[t].append([c() for c in calls[t]])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not errors, errors
    mismatches = []
    for t in range(THREADS):
        assert len(results[t]) == ROUNDS
        for r, round_results in enumerate(results[t]):
            for i, (got, want) in enumerate(zip(round_results, sequential[t])):
                for j, (a, b) in enumerate(zip(got, want)):
                    if not bitwise_equal(a, b):
                        mismatches.append(f"thread {t} round {r} call {i} tensor {j}")
    assert not mismatches, f"{len(mismatches)} results differ from the sequential ones: " + \
        ", ".join(mismatches[:20])
