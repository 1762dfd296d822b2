"""The cases of tests/test_distributed.py, run inside real process groups.

One spawn of WORLD processes (gloo, file:// rendezvous, 1 thread each) runs every case, since
starting processes costs seconds: groups of P = 1 and 2 are subgroups of that world (real
process groups of their own; "P2b" is ranks 2 and 3, so group ranks differ from global ranks),
P = 4 is the world. A rank outside a case's group skips it. Each rank appends each case's
outcome ("ok" or the traceback) to its own JSON file, which the parent reads, so pytest reports
every case on its own and a crash or hang loses only the cases after it.

Every comparison gathers the ranks' results (unshard) and holds them against single-process
flashattn on the whole sequence and the float64 reference (flashattn/_reference.py): the
context-parallel error against float64 must be at most 2x single-process flashattn's own,
plus tolerance.py's epsilon."""
import datetime
import json
import os
import traceback
import zlib

import torch
import torch.distributed as dist

WORLD = 4
GROUPS = {"P1": [0], "P2": [0, 1], "P2b": [2, 3], "P4": [0, 1, 2, 3]}
CASES = {}  # name -> (group key, function(group, seed))


def case(name, group_key):
    def register(fn):
        assert name not in CASES
        CASES[name] = (group_key, fn)
        return fn
    return register


# ---------------------------------------------------------------------------------------------
# The single-process baselines and the comparison.

def _inputs(seed, batch, seqlen, heads, heads_kv, dim, dtype, varlen_total=None, seqlen_k=None):
    g = torch.Generator().manual_seed(seed)
    rows = (varlen_total,) if varlen_total is not None else (batch, seqlen)
    rows_k = rows if seqlen_k is None else (batch, seqlen_k)
    q, k, v, dout = (torch.randn(*r, h, dim, generator=g).to(dtype)
                     for r, h in ((rows, heads), (rows_k, heads_kv), (rows_k, heads_kv),
                                  (rows, heads)))
    lse_shape = (heads, varlen_total) if varlen_total is not None else (batch, heads, seqlen)
    dlse = torch.randn(*lse_shape, generator=g)
    return q, k, v, dout, dlse


def _grads(fn, q, k, v, dout, dlse):
    """out, lse, dq, dk, dv of fn(q, k, v) -> (out, lse) for the loss <out, dout> + <lse, dlse>."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    loss = (out.double() * dout.double()).sum()
    if dlse is not None:
        finite = torch.isfinite(lse)
        loss = loss + (torch.where(finite, lse, 0).double() * dlse.double()).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    return {"out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


def _reference_dense(q, k, v, **kw):
    from flashattn._reference import attention_reference
    return attention_reference(q, k, v, **kw)


def _reference_varlen(cu, q, k, v, keep=None, alibi_slopes=None, **kw):
    """The float64 reference per sequence of a packed batch: out (T, H, D), lse (H, T). keep:
    the dropout keep mask (B, H, max_seqlen, max_seqlen); alibi_slopes (H,) or (B, H)."""
    from flashattn._reference import attention_reference
    outs, lses = [], []
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        if keep is not None:
            kw["dropout_mask"] = keep[i:i + 1, :, :b - a, :b - a]
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[i]
        out, lse = attention_reference(q[a:b][None], k[a:b][None], v[a:b][None],
                                       alibi_slopes=slopes, **kw)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def _half_ulp_of_largest(ref, dtype):
    """Half the spacing of `dtype` at ref's largest finite magnitude: what rounding that value
    to `dtype` may cost."""
    finite = ref[torch.isfinite(ref)].abs()
    if finite.numel() == 0 or finite.max() == 0:
        return 0.0
    return torch.finfo(dtype).eps * 2.0 ** torch.floor(torch.log2(finite.max())).item() / 2


def _assert_close(name, cp, single, ref):
    """At most 2x single-process flashattn's largest error against float64, plus the dtype's
    epsilon and half a unit in the last place of the largest reference value. The ring rounds
    its 16-bit dS, P and outputs as one process does, but its values differ slightly (D from
    the float32 merged out, the LSE merged in float64), so each rounding is another draw of the
    same noise; the largest error is decided by the few largest values (a causal row that sees
    two keys, say), and one process can draw lucky there: half an ulp allows that draw, without
    which 1 seed in 60 of the bf16 causal ring failed at 2.8x (docs/lab/2026-12-03-context-
    parallel-fp32-partials.md)."""
    from tolerance import EPSILON, max_abs_error
    assert cp.shape == ref.shape, f"{name}: shape {tuple(cp.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(cp).any(), f"{name}: NaN"
    err, yard = max_abs_error(cp, ref), max_abs_error(single, ref)
    rounding = _half_ulp_of_largest(ref, cp.dtype)
    bound = 2 * yard + EPSILON[cp.dtype] + rounding
    assert err <= bound, (f"{name}: context-parallel error {err:.3e} against float64 exceeds 2x "
                          f"single-process flashattn's {yard:.3e} (+eps, + half an ulp "
                          f"{rounding:.1e} of the largest value) in {cp.dtype}")


def _compare(cp, single, ref, names=("out", "lse", "dq", "dk", "dv")):
    for name in names:
        _assert_close(name, cp[name], single[name], ref[name])


# ---------------------------------------------------------------------------------------------
# Attention cases: dense ring, varlen ring, Ulysses.

def _attention_case(group, seed, method, *, dtype, layout, causal, batch=2, seqlen=None,
                    heads=4, heads_kv=2, dim=32, lengths=None, softcap=0.0, window=(-1, -1),
                    alibi=False, scale=None, deterministic=False, repeat=False, seqlen_k=None,
                    dropout=0.0):
    import flashattn
    from flashattn.distributed import (ring_flash_attn_func, ring_flash_attn_varlen_func, shard,
                                       ulysses_flash_attn_func, unshard)
    varlen = lengths is not None
    cu = [0]
    for n in lengths or ():
        cu.append(cu[-1] + n)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    q, k, v, dout, dlse = _inputs(seed, batch, seqlen, heads, heads_kv, dim, dtype,
                                  varlen_total=cu[-1] if varlen else None, seqlen_k=seqlen_k)
    # alibi: True for (heads,) slopes, "batch" for (batch, heads).
    slope_shape = ((len(lengths) if varlen else batch, heads) if alibi == "batch" else (heads,))
    slopes = (torch.rand(*slope_shape, generator=torch.Generator().manual_seed(seed + 1))
              if alibi else None)
    kw = dict(softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
              alibi_slopes=slopes, dropout_p=dropout)
    ref_kw = dict(softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                  alibi_slopes=None if slopes is None else slopes.double())
    if dropout:
        # Dropout: every call below runs under the same torch seed, so each draws the same
        # [seed, offset], and the reference drops what the kernels' keep mask says.
        torch.manual_seed(seed)
        rng = torch.ops.flashattn.dropout_rng_state(q)
        keep = torch.ops.flashattn.dropout_keep_mask(
            rng, dropout, len(lengths) if varlen else batch, heads,
            max(lengths) if varlen else seqlen, max(lengths) if varlen else (seqlen_k or seqlen))
        ref_kw.update(dropout_p=dropout, **({"keep": keep} if varlen else {"dropout_mask": keep}))

    def seeded(fn):
        def call(*args):
            torch.manual_seed(seed)
            return fn(*args)
        return call

    if varlen:
        longest = max(lengths)
        single = _grads(seeded(lambda a, b, c: flashattn.flash_attn_varlen_func(
            a, b, c, cu_t, cu_t, longest, longest, deterministic=deterministic,
            return_attn_probs=True, **kw)[:2]), q, k, v, dout, dlse)
        ref = _grads(lambda a, b, c: _reference_varlen(cu, a, b, c, **ref_kw),
                     q.double(), k.double(), v.double(), dout, dlse)
        sh = dict(group=group, dim=0, layout=layout, cu_seqlens=cu_t)
        lse_sh = lambda t: shard(t.t(), **sh).t()  # noqa: E731  (H, T) rows along dim 1
        unlse = lambda t: unshard(t.t().contiguous(), **sh).t()  # noqa: E731

        def cp_fn(a, b, c):
            out, lse, none = ring_flash_attn_varlen_func(
                a, b, c, cu_t, longest, group, deterministic=deterministic,
                return_attn_probs=True, layout=layout, **kw)
            assert none is None
            return out, lse
    else:
        single = _grads(seeded(lambda a, b, c: flashattn.flash_attn_func(
            a, b, c, deterministic=deterministic, return_attn_probs=True, **kw)[:2]),
            q, k, v, dout, dlse)
        ref = _grads(lambda a, b, c: _reference_dense(a, b, c, **ref_kw),
                     q.double(), k.double(), v.double(), dout, dlse)
        sh = dict(group=group, dim=1, layout=layout)
        lse_sh = lambda t: shard(t, group, dim=2, layout=layout)  # noqa: E731
        unlse = lambda t: unshard(t, group, dim=2, layout=layout)  # noqa: E731
        func = ring_flash_attn_func if method == "ring" else ulysses_flash_attn_func

        def cp_fn(a, b, c):
            out, lse, none = func(a, b, c, group, deterministic=deterministic,
                                  return_attn_probs=True, layout=layout, **kw)
            assert none is None
            return out, lse

    local = [shard(t, **sh) for t in (q, k, v, dout)]
    got = _grads(seeded(cp_fn), *local[:3], local[3], lse_sh(dlse))
    if repeat:
        again = _grads(seeded(cp_fn), *local[:3], local[3], lse_sh(dlse))
        for name in got:
            assert torch.equal(got[name], again[name]), f"{name}: not bitwise repeatable"
    full = {name: (unlse(t) if name == "lse" else unshard(t.contiguous(), **sh))
            for name, t in got.items()}
    _compare(full, single, ref)


def _attention(name, group_key, method, **kw):
    case(name, group_key)(lambda group, seed: _attention_case(group, seed, method, **kw))


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
VARLEN_LENGTHS = [16, 0, 8, 40]   # an empty sequence; chunks of 1 token at P = 4 (zigzag)
for P in ("P1", "P2", "P4"):
    n = int(P[1:])
    S = 2 * n * 7                 # zigzag chunks of 7 tokens
    _attention(f"ring-zigzag-causal-gqa-fp32-{P}", P, "ring", dtype=F32, layout="zigzag",
               causal=True, seqlen=S)
    _attention(f"ring-zigzag-causal-softcap-bf16-{P}", P, "ring", dtype=BF16, layout="zigzag",
               causal=True, seqlen=S, softcap=3.0, heads=4, heads_kv=4)
    _attention(f"ring-contiguous-causal-mqa-fp32-{P}", P, "ring", dtype=F32,
               layout="contiguous", causal=True, seqlen=n * 9, heads_kv=1, dim=40)
    _attention(f"ring-contiguous-causal-bf16-{P}", P, "ring", dtype=BF16, layout="contiguous",
               causal=True, seqlen=n * 16)
    _attention(f"ring-zigzag-full-bf16-{P}", P, "ring", dtype=BF16, layout="zigzag",
               causal=False, seqlen=S)
    _attention(f"ring-contiguous-full-scale-fp32-{P}", P, "ring", dtype=F32,
               layout="contiguous", causal=False, seqlen=n * 5, scale=0.3, deterministic=True)
    _attention(f"ring-varlen-zigzag-causal-fp32-{P}", P, "ring_varlen", dtype=F32,
               layout="zigzag", causal=True, lengths=VARLEN_LENGTHS)
    _attention(f"ring-varlen-zigzag-causal-gqa-bf16-{P}", P, "ring_varlen", dtype=BF16,
               layout="zigzag", causal=True, lengths=VARLEN_LENGTHS, softcap=5.0)
    _attention(f"ring-varlen-contiguous-causal-fp32-{P}", P, "ring_varlen", dtype=F32,
               layout="contiguous", causal=True, lengths=[4, 12, 8])
    _attention(f"ring-varlen-zigzag-full-bf16-{P}", P, "ring_varlen", dtype=BF16,
               layout="zigzag", causal=False, lengths=VARLEN_LENGTHS)
    _attention(f"ulysses-zigzag-causal-window-gqa-fp32-{P}", P, "ulysses", dtype=F32,
               layout="zigzag", causal=True, seqlen=S, heads=8, heads_kv=4, window=(9, 0))
    _attention(f"ulysses-contiguous-alibi-bf16-{P}", P, "ulysses", dtype=BF16,
               layout="contiguous", causal=True, seqlen=n * 12, heads=4, heads_kv=4, alibi=True)
    _attention(f"ulysses-zigzag-full-window-softcap-bf16-{P}", P, "ulysses", dtype=BF16,
               layout="zigzag", causal=False, seqlen=S, heads=8, heads_kv=4, window=(5, 3),
               softcap=4.0)
    _attention(f"ring-zigzag-causal-repeatable-bf16-{P}", P, "ring", dtype=BF16,
               layout="zigzag", causal=True, seqlen=S, deterministic=True, repeat=True)
    _attention(f"ring-varlen-zigzag-repeatable-bf16-{P}", P, "ring_varlen", dtype=BF16,
               layout="zigzag", causal=True, lengths=VARLEN_LENGTHS, repeat=True)
    _attention(f"ulysses-zigzag-causal-repeatable-bf16-{P}", P, "ulysses", dtype=BF16,
               layout="zigzag", causal=True, seqlen=S, heads=4, heads_kv=4, repeat=True)
    # float16 rings: partial outputs in float32 (out_fp32), as bfloat16's.
    _attention(f"ring-zigzag-causal-gqa-fp16-{P}", P, "ring", dtype=F16, layout="zigzag",
               causal=True, seqlen=S)
    _attention(f"ring-varlen-zigzag-full-fp16-{P}", P, "ring_varlen", dtype=F16,
               layout="zigzag", causal=False, lengths=VARLEN_LENGTHS)
    # Stage 2 (block offsets): window, ALiBi and dropout through the ring, dropout through
    # Ulysses; chunks of 7 tokens put blocks at keys that are not multiples of 4.
    _attention(f"ring-zigzag-causal-window-alibi-fp32-{P}", P, "ring", dtype=F32,
               layout="zigzag", causal=True, seqlen=S, window=(9, -1), alibi=True)
    _attention(f"ring-zigzag-full-window-bf16-{P}", P, "ring", dtype=BF16, layout="zigzag",
               causal=False, seqlen=S, window=(5, 3))
    _attention(f"ring-contiguous-causal-dropout-fp32-{P}", P, "ring", dtype=F32,
               layout="contiguous", causal=True, seqlen=n * 9, dropout=0.2)
    _attention(f"ring-zigzag-causal-dropout-alibi-bf16-{P}", P, "ring", dtype=BF16,
               layout="zigzag", causal=True, seqlen=S, dropout=0.3, alibi="batch")
    _attention(f"ring-varlen-zigzag-causal-window-alibi-dropout-fp32-{P}", P, "ring_varlen",
               dtype=F32, layout="zigzag", causal=True, lengths=VARLEN_LENGTHS, window=(6, -1),
               alibi="batch", dropout=0.25)
    _attention(f"ring-varlen-contiguous-full-window-bf16-{P}", P, "ring_varlen", dtype=BF16,
               layout="contiguous", causal=False, lengths=[4, 12, 8], window=(4, 2))
    _attention(f"ulysses-zigzag-causal-dropout-gqa-fp32-{P}", P, "ulysses", dtype=F32,
               layout="zigzag", causal=True, seqlen=S, heads=8, heads_kv=4, dropout=0.3)
# Group ranks that are not global ranks (the ring's peers are mapped through the group).
_attention("ring-zigzag-causal-gqa-fp32-P2b", "P2b", "ring", dtype=F32, layout="zigzag",
           causal=True, seqlen=28)
_attention("ulysses-zigzag-causal-fp32-P2b", "P2b", "ulysses", dtype=F32, layout="zigzag",
           causal=True, seqlen=28)
# Cross-attention (no causal mask): keys of another length than the queries.
for P in ("P2", "P4"):
    n = int(P[1:])
    _attention(f"ring-zigzag-full-cross-fp32-{P}", P, "ring", dtype=F32, layout="zigzag",
               causal=False, seqlen=2 * n * 3, seqlen_k=2 * n * 5)
    _attention(f"ulysses-contiguous-full-cross-bf16-{P}", P, "ulysses", dtype=BF16,
               layout="contiguous", causal=False, seqlen=n * 3, seqlen_k=n * 8, heads=8,
               heads_kv=4)
    # The window's diagonal is the whole sequence's bottom-right one (Sk - Sq = 2P * 2).
    _attention(f"ring-zigzag-window-cross-dropout-fp32-{P}", P, "ring", dtype=F32,
               layout="zigzag", causal=False, seqlen=2 * n * 3, seqlen_k=2 * n * 5,
               window=(3, 1), dropout=0.2)
# Causal cross-length (issue 32 stage 3): the diagonal is the whole sequence's bottom-right one,
# Sk - Sq = 2P * 2 (keys before the queries), or 2P * -2 (the first 2P * 2 queries see no key:
# out 0, LSE -inf); in the ring every block is told it, Ulysses attends to whole sequences.
for P in ("P1", "P2", "P4"):
    n = int(P[1:])
    _attention(f"ring-zigzag-causal-cross-bf16-{P}", P, "ring", dtype=BF16, layout="zigzag",
               causal=True, seqlen=2 * n * 3, seqlen_k=2 * n * 5)
    _attention(f"ring-zigzag-causal-cross-longer-q-fp32-{P}", P, "ring", dtype=F32,
               layout="zigzag", causal=True, seqlen=2 * n * 5, seqlen_k=2 * n * 3,
               window=(4, -1))
    _attention(f"ring-contiguous-causal-cross-alibi-dropout-fp16-{P}", P, "ring", dtype=F16,
               layout="contiguous", causal=True, seqlen=n * 6, seqlen_k=n * 9, alibi=True,
               dropout=0.2)
    _attention(f"ulysses-zigzag-causal-cross-bf16-{P}", P, "ulysses", dtype=BF16,
               layout="zigzag", causal=True, seqlen=2 * n * 5, seqlen_k=2 * n * 3, heads=8,
               heads_kv=4)
# Longer sequences at P = 4: several tiles per block.
_attention("ring-zigzag-causal-long-bf16-P4", "P4", "ring", dtype=BF16, layout="zigzag",
           causal=True, batch=1, seqlen=8 * 40, heads=2, heads_kv=1, dim=64)


# ---------------------------------------------------------------------------------------------
# shard / unshard.

def _shard_cases(group, seed):
    from flashattn.distributed import shard, unshard
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    x = torch.arange(2 * 8 * world * 3 * 5, dtype=torch.float32).reshape(2, 8 * world * 3, 5)
    # zigzag along dim 1: chunks rank and 2P-1-rank of 2P.
    c = x.shape[1] // (2 * world)
    want = torch.cat([x[:, rank * c:(rank + 1) * c], x[:, (2 * world - 1 - rank) * c:][:, :c]], 1)
    assert torch.equal(shard(x, group), want)
    c = x.shape[1] // world
    assert torch.equal(shard(x, group, layout="contiguous"), x[:, rank * c:(rank + 1) * c])
    for layout in ("zigzag", "contiguous"):
        for dim in (1, -2, 0):
            y = x if dim != 0 else x.transpose(0, 1).contiguous()
            assert torch.equal(unshard(shard(y, group, dim=dim, layout=layout), group, dim=dim,
                                       layout=layout), y)
        cu = torch.tensor([0, 0, 4 * world, 6 * world, 16 * world], dtype=torch.int32)
        packed = torch.randn(16 * world, 3, generator=torch.Generator().manual_seed(seed))
        local = shard(packed, group, dim=0, layout=layout, cu_seqlens=cu)
        assert local.shape[0] == 16
        assert torch.equal(unshard(local, group, dim=0, layout=layout, cu_seqlens=cu), packed)
    # Varlen: each sequence on its own.
    cu = torch.tensor([0, 2 * world, 6 * world], dtype=torch.int32)
    packed = torch.arange(6 * world, dtype=torch.float32)
    got = shard(packed, group, dim=0, cu_seqlens=cu)
    per = lambda s, n: [s + rank * n + t for t in range(n)] + [  # noqa: E731
        s + (2 * world - 1 - rank) * n + t for t in range(n)]
    assert got.tolist() == per(0, 1) + per(2 * world, 2), got.tolist()
    # unshard's gradient: the sum over ranks of their copies' gradients, at this rank's rows.
    local = shard(x, group).requires_grad_()
    full = unshard(local, group)
    (full * (rank + 1)).sum().backward()
    assert torch.equal(local.grad, torch.full_like(local, world * (world + 1) / 2))


def _bad_lengths(group, seed):
    import pytest
    from flashattn.distributed import ring_flash_attn_func, ring_flash_attn_varlen_func, shard
    world = dist.get_world_size(group)
    x = torch.randn(1, 2 * world + 1, 2, 8)
    with pytest.raises(ValueError, match=f"is {2 * world + 1}, which does not divide into "
                                         f"{2 * world} equal chunks"):
        shard(x, group)
    if world > 1:
        with pytest.raises(ValueError, match=f"is {world + 1}, which does not divide"):
            shard(x[:, :world + 1], group, layout="contiguous")
    cu = torch.tensor([0, 2 * world, 2 * world + 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"the length of sequence 1 .* is 3, which does not"):
        shard(torch.randn(2 * world + 3, 2, 8), group, dim=0, cu_seqlens=cu)
    with pytest.raises(ValueError, match="dim must be 0"):
        shard(torch.randn(1, 2 * world + 3, 2), group, dim=1, cu_seqlens=cu)
    q = torch.randn(1, 3, 2, 8)
    with pytest.raises(ValueError, match="local sequence length is 3"):
        ring_flash_attn_func(q, q, q, group, causal=True)
    qv = torch.randn(2 * world + 3, 2, 8)
    with pytest.raises(ValueError, match="the length of sequence 1"):
        ring_flash_attn_varlen_func(qv, qv, qv, cu, 2 * world, group)
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_flash_attn_func(q, q, q, group, layout="striped")


def _bad_alibi(group, seed):
    import pytest
    from flashattn.distributed import ring_flash_attn_func
    world = dist.get_world_size(group)
    q = torch.randn(2, 4, 3, 8)
    with pytest.raises(ValueError, match=r"alibi_slopes must be float32 of shape \(3,\) or "
                                         r"\(2, 3\)"):
        ring_flash_attn_func(q, q, q, group, alibi_slopes=torch.ones(world + 3))


def _bad_heads(group, seed):
    import pytest
    from flashattn.distributed import ulysses_flash_attn_func
    world = dist.get_world_size(group)
    q = torch.randn(1, 4, world + 1, 8)
    with pytest.raises(ValueError, match=f"heads of q \\({world + 1}\\) must divide by the "
                                         f"group's size \\({world}\\)"):
        ulysses_flash_attn_func(q, q, q, group)
    kv = torch.randn(1, 4, world // 2, 8)
    q = torch.randn(1, 4, world, 8)
    with pytest.raises(ValueError, match=f"heads of k and v \\({world // 2}\\) must divide"):
        ulysses_flash_attn_func(q, kv, kv, group)


def _not_initialized_message(group, seed):
    """The group argument: a wrong type fails inside torch with its own error; None works."""
    from flashattn.distributed import shard
    x = torch.randn(1, 2 * dist.get_world_size(), 1)
    assert shard(x).shape[1] == 2


def _plain_calls(group, seed):
    """Without return_attn_probs each function returns out alone, and its gradients are those of
    the (out, lse, None) call when only out is used (the LSE's gradient is None, not zeros)."""
    from flashattn.distributed import (ring_flash_attn_func, ring_flash_attn_varlen_func, shard,
                                       ulysses_flash_attn_func)
    world = dist.get_world_size(group)
    q, k, v, dout, _ = _inputs(seed, 1, 4 * world, 2 * world, world, 16, torch.bfloat16)
    cu = torch.tensor([0, 2 * world, 4 * world], dtype=torch.int32)
    calls = [
        (lambda *t, **kw: ring_flash_attn_func(*t, group, causal=True, **kw), 1, None),
        (lambda *t, **kw: ulysses_flash_attn_func(*t, group, causal=True, **kw), 1, None),
        (lambda *t, **kw: ring_flash_attn_varlen_func(*t, cu, 2 * world, group, causal=True,
                                                      **kw), 0, cu),
    ]
    for fn, dim, cu_seqlens in calls:
        flat = (lambda t: t.flatten(0, 1)) if dim == 0 else (lambda t: t)
        local = [shard(flat(t), group, dim=dim, cu_seqlens=cu_seqlens) for t in (q, k, v, dout)]
        plain = _grads(lambda a, b, c: (fn(a, b, c), torch.zeros(())), *local[:3], local[3], None)
        full = _grads(lambda a, b, c: fn(a, b, c, return_attn_probs=True)[:2], *local[:3],
                      local[3], None)
        assert isinstance(fn(*local[:3]), torch.Tensor)
        for name in ("out", "dq", "dk", "dv"):
            assert torch.equal(plain[name], full[name]), name
        # out.sum() and lse.sum(): expanded (stride 0) gradients, as the README's example has.
        a, b, c = (t.detach().clone().requires_grad_() for t in local[:3])
        out, lse, _ = fn(a, b, c, return_attn_probs=True)
        (out.sum() + lse.sum()).backward()
        ones = _grads(lambda a, b, c: fn(a, b, c, return_attn_probs=True)[:2], *local[:3],
                      torch.ones_like(local[3]), torch.ones_like(lse))
        for name, grad in (("dq", a.grad), ("dk", b.grad), ("dv", c.grad)):
            torch.testing.assert_close(grad, ones[name], msg=name)


def _ring_traffic(group, seed):
    """What the ring sends, and when: only the kv heads (GQA), in the input dtype; dK/dV in
    float32; and each step's transfer is posted before that step's blocks are computed."""
    import flashattn.distributed.ring as ring
    from flashattn.distributed import shard
    world = dist.get_world_size(group)
    q, k, v, dout, _ = _inputs(seed, 1, 4 * world, 8, 2, 16, torch.bfloat16)
    events = []
    real_step, real_fwd, real_bwd = ring.RingStep, ring._FWD, ring._BWD

    class RecordedStep(real_step):
        def __init__(self, group, world, rank, tensors, tag):
            events.append(("post", tag, [(tuple(t.shape), t.dtype) for t in tensors]))
            super().__init__(group, world, rank, tensors, tag)

    calls = []  # the forward op's calls: (input dtypes, out_fp32, out's dtype)
    bwd_calls = []  # the backward's: (dout, q, k, v dtypes, grads_fp32, dq/dk/dv dtypes)

    def recorded(name, op):
        def call(*args, **kwargs):
            events.append((name,))
            result = op(*args, **kwargs)
            if name == "fwd":
                calls.append(([t.dtype for t in args[:3]], kwargs.get("out_fp32", False),
                              result[0].dtype))
            else:
                bwd_calls.append(([t.dtype for t in (args[0], *args[4:7])],
                                  kwargs.get("grads_fp32", False), [t.dtype for t in result[:3]]))
            return result
        return call
    ring.RingStep = RecordedStep
    ring._FWD, ring._BWD = recorded("fwd", real_fwd), recorded("bwd", real_bwd)
    try:
        local = [shard(t, group).requires_grad_() for t in (q, k, v)]
        out = ring.ring_flash_attn_func(*local, group, causal=True)
        forward = [e[0] for e in events]
        out.backward(shard(dout, group))
    finally:
        ring.RingStep, ring._FWD, ring._BWD = real_step, real_fwd, real_bwd
    posts = [e for e in events if e[0] == "post"]
    kv_shape = (1, 4, 2, 16)
    for _, tag, sent in posts:
        want = torch.float32 if tag == ring._TAG_DKV else torch.bfloat16
        assert sent == [(kv_shape, want)] * 2, (tag, sent)
    tags = [tag for _, tag, _ in posts]
    assert tags.count(ring._TAG_KV) == world - 1 and tags.count(ring._TAG_DKV) == (
        world if world > 1 else 0), tags
    # Forward: step s's transfer is posted before step s computes its blocks (one call per
    # pair of pieces that see each other; P - 1 overlapped steps); backward: each step's K/V
    # transfer before its blocks too.
    assert forward.count("post") == world - 1 and forward[-1] == "fwd", forward
    if world > 1:  # each post, the first one first, is followed by its step's blocks
        assert forward[0] == "post" and all(
            forward[i + 1] == "fwd" for i, e in enumerate(forward) if e == "post"), forward
    # The forward's blocks compute from the 16-bit inputs; with more than one block their
    # partial outputs come back in float32 (out_fp32), merged in float32 and rounded once.
    partial = torch.float32 if world > 1 else torch.bfloat16
    assert calls and all(c == ([torch.bfloat16] * 3, world > 1, partial) for c in calls), calls
    # The backward's blocks compute from the 16-bit inputs too, and with more than one block
    # return float32 gradients (grads_fp32), summed in float32 and rounded once.
    assert bwd_calls and all(c == ([torch.bfloat16] * 4, world > 1, [partial] * 3)
                             for c in bwd_calls), bwd_calls
    backward = [e[0] if e[0] != "post" else e[1] for e in events[len(forward):]]
    for step in range(world - 1):
        i = [j for j, e in enumerate(backward) if e == ring._TAG_KV_BACKWARD][step]
        assert backward[i + 1] == "bwd", backward


def _one_rank_is_flash_attn(group, seed):
    """With one rank the ring is one block: bit for bit flash_attn_func / the varlen one."""
    import flashattn
    from flashattn.distributed import ring_flash_attn_func, ring_flash_attn_varlen_func
    q, k, v, dout, dlse = _inputs(seed, 2, 30, 4, 2, 32, torch.bfloat16)
    for causal in (False, True):
        ring = _grads(lambda a, b, c: ring_flash_attn_func(
            a, b, c, group, causal=causal, softcap=2.0, return_attn_probs=True)[:2],
            q, k, v, dout, dlse)
        single = _grads(lambda a, b, c: flashattn.flash_attn_func(
            a, b, c, causal=causal, softcap=2.0, return_attn_probs=True)[:2], q, k, v, dout, dlse)
        for name in ring:
            assert torch.equal(ring[name], single[name]), (causal, name)
    cu = torch.tensor([0, 10, 30, 60], dtype=torch.int32)
    flat = [t.flatten(0, 1) for t in (q, k, v, dout)]
    lse_flat = dlse.transpose(0, 1).flatten(1, 2)
    ring = _grads(lambda a, b, c: ring_flash_attn_varlen_func(
        a, b, c, cu, 30, group, causal=True, return_attn_probs=True)[:2], *flat, lse_flat)
    single = _grads(lambda a, b, c: flashattn.flash_attn_varlen_func(
        a, b, c, cu, cu, 30, 30, causal=True, return_attn_probs=True)[:2], *flat, lse_flat)
    for name in ring:
        assert torch.equal(ring[name], single[name]), ("varlen", name)


case("one-rank-is-flash-attn-P1", "P1")(_one_rank_is_flash_attn)
for P in ("P1", "P2", "P4"):
    case(f"ring-traffic-{P}", P)(_ring_traffic)
    case(f"plain-calls-{P}", P)(_plain_calls)
    case(f"shard-unshard-{P}", P)(_shard_cases)
    case(f"bad-lengths-{P}", P)(_bad_lengths)
    case(f"bad-alibi-{P}", P)(_bad_alibi)
case("bad-heads-P2", "P2")(_bad_heads)
case("bad-heads-P4", "P4")(_bad_heads)
case("default-group-P4", "P4")(_not_initialized_message)


# ---------------------------------------------------------------------------------------------
# The worker and the parent's driver.

def worker(rank, rendezvous, outdir, seed, names):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    groups = {key: dist.new_group(ranks) for key, ranks in GROUPS.items()}
    path = os.path.join(outdir, f"rank{rank}.jsonl")
    for name in names:
        key, fn = CASES[name]
        if rank in GROUPS[key]:
            try:  # seeded by name, so that -k reruns a case on the same inputs
                fn(groups[key], (seed + zlib.crc32(name.encode())) % 2**31)
                outcome = "ok"
            except Exception:  # reported per case by the parent
                outcome = traceback.format_exc()
            with open(path, "a") as f:
                f.write(json.dumps({"case": name, "rank": rank, "outcome": outcome}) + "\n")
        dist.barrier()
    dist.destroy_process_group()


def run_all(outdir, seed, names=None, timeout=600):
    """Runs the cases in WORLD spawned processes; returns {case: [(rank, outcome), ...]}, and
    under "__driver__" what went wrong with the processes themselves, if anything."""
    import torch.multiprocessing as mp
    names = list(CASES) if names is None else names
    outdir = str(outdir)
    context = mp.spawn(worker, args=(os.path.join(outdir, "rendezvous"), outdir, seed, names),
                       nprocs=WORLD, join=False)
    driver = None
    try:
        import time
        deadline = time.monotonic() + timeout
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                driver = f"workers still running after {timeout} s; terminated"
                for p in context.processes:
                    p.terminate()
                break
    except Exception:
        driver = traceback.format_exc()
    results = {}
    for rank in range(WORLD):
        path = os.path.join(outdir, f"rank{rank}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    record = json.loads(line)
                    results.setdefault(record["case"], []).append((rank, record["outcome"]))
    if driver:
        results["__driver__"] = [(-1, driver)]
    return results
