"""Ring attention: K and V travel around the ranks; each rank attends its local queries to every
rank's keys, one block per step, and merges the blocks by their LSE (merge.py).

Which blocks a step computes. At step s rank r holds the K/V of rank src = (r - s) mod P. Under a
causal mask a (query chunk i, key chunk j) pair of the global sequence is full (j < i), plain
causal with equal lengths (j = i) or empty (j > i), so no block needs a diagonal offset:
  step 0 (src = r):  the local queries against the local keys, causal. With zigzag the local
                     sequence is chunks (r, 2P-1-r) of both, which plain causal gets right.
  zigzag, src < r:   all local queries against the first half of the keys (chunk src), full.
  zigzag, src > r:   the second half of the queries (chunk 2P-1-r) against all the keys, full.
  contiguous:        full if src < r, nothing if src > r (ranks with late chunks do more work).
Without causal every step is one full block. With zigzag each rank computes the same amount.

Backward: every block's backward gets the global (merged) out and lse, so its P_ij are the
global probabilities and its dQ, dK, dV are exactly its share. dQ accumulates locally, dK and
dV in a float32 accumulator that travels around the ring with K/V and reaches its owner after
P steps; each is rounded to the input dtype once.
"""
import operator
from typing import NamedTuple, Optional

import torch
from torch.autograd.function import once_differentiable

from . import _group
from .comm import RingStep
from .merge import accumulator_dtype, merge_
from .sharding import check_varlen_lengths, seqlens

_FWD = torch.ops.flashattn.fwd.default
_BWD = torch.ops.flashattn.bwd.default
_TAG_KV, _TAG_KV_BACKWARD, _TAG_DKV = 11, 12, 13


class _Block(NamedTuple):
    q_rows: Optional[tuple]   # (start, length) of the local query rows, None: all of them
    kv_rows: Optional[tuple]  # the same for the keys
    causal: bool
    extra: dict               # varlen arguments of the op


def _rows(t, rows, dim):
    return t if rows is None or t is None else t.narrow(dim, *rows)


class _Plan:
    """The blocks each step computes (see the module's docstring), dense or varlen."""

    def __init__(self, world, rank, layout, causal, seqlen_q=None, seqlen_k=None,
                 local_sequences=None, device=None):
        self.world, self.rank, self.layout, self.causal = world, rank, layout, causal
        self.varlen = local_sequences is not None
        self.seq_dim = 0 if self.varlen else 1
        if self.varlen:
            self._varlen_setup(local_sequences, device)
        else:
            self.seqlen_q, self.seqlen_k = seqlen_q, seqlen_k

    def _varlen_setup(self, sequences, device):
        def int32(values):
            return torch.tensor(values, dtype=torch.int32, device=device)
        starts = [start for start, _ in sequences]
        lengths = [length for _, length in sequences]
        total = starts[-1] + lengths[-1] if sequences else 0
        longest = max(lengths, default=0)
        cu = int32(starts + [total])
        self.full = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                         max_seqlen_k=longest)
        # Every key sequence's first half (chunk src), through seqused_k.
        self.first_half_keys = dict(self.full, seqused_k=int32([n // 2 for n in lengths]))
        # Every query sequence's second half against all of its keys: each sequence b is split
        # into two query sequences, its first half (given no keys: out 0, lse -inf, merged as
        # nothing) and its second half (given all of sequence b's keys).
        cu_q, cu_k = [0], [0]
        for start, length in sequences:
            cu_q += [start + length // 2, start + length]
            cu_k += [start, start + length]
        self.second_half_queries = dict(cu_seqlens_q=int32(cu_q), cu_seqlens_k=int32(cu_k),
                                        max_seqlen_q=longest - longest // 2,
                                        max_seqlen_k=longest)

    def blocks(self, src):
        if not self.causal or src == self.rank:
            return [self._block(None, None, self.causal and src == self.rank, "full")]
        if self.layout == "contiguous":
            return [self._block(None, None, False, "full")] if src < self.rank else []
        if src < self.rank:
            return [self._block(None, "first", False, "first_half_keys")]
        return [self._block("second", None, False, "second_half_queries")]

    def _block(self, q_half, kv_half, causal, varlen_kind):
        if self.varlen:
            return _Block(None, None, causal, getattr(self, varlen_kind))
        q_rows = (self.seqlen_q // 2, self.seqlen_q - self.seqlen_q // 2) if q_half else None
        kv_rows = (0, self.seqlen_k // 2) if kv_half else None
        return _Block(q_rows, kv_rows, causal, {})


class _Config(NamedTuple):
    group: object
    world: int
    rank: int
    plan: _Plan
    op: dict  # the op arguments every block shares (scale, softcap, deterministic)
    # False: every step computes its blocks on the local K/V and nothing is sent, so that a
    # benchmark can time the computation alone (flashattn/bench/context_parallel.py).
    communicate: bool = True


def _forward(q, k, v, cfg):
    acc = accumulator_dtype(q.dtype)
    seq = cfg.plan.seq_dim
    out_acc = torch.zeros(q.shape, dtype=acc, device=q.device)
    if cfg.plan.varlen:  # out (T, H, D), lse (H, T); dense: (B, S, H, D), (B, H, S)
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    lse_acc = torch.full(lse_shape, float("-inf"), dtype=acc, device=q.device)
    # The fwd op returns out in the input dtype. Partial outputs rounded to 16 bits each, then
    # merged, measured up to 2.6x single-process flashattn's error against float64 in bfloat16
    # (and through out, dK up to 2.2x), over the 2x target; so with more than one block they
    # are computed in float32 and rounded once, after the merge. K/V travel in their own dtype.
    # Stage 2: the split-KV path's float32 partial outputs from the op itself.
    compute = acc if cfg.world > 1 else q.dtype
    q_c = q.to(compute)
    kv = (k, v)
    for step in range(cfg.world):
        # Post the next step's transfer before computing this one, so that they overlap.
        pending = (RingStep(cfg.group, cfg.world, cfg.rank, kv, _TAG_KV)
                   if step + 1 < cfg.world and cfg.communicate else None)
        k_c, v_c = (t.to(compute) for t in kv)
        for blk in cfg.plan.blocks((cfg.rank - step) % cfg.world):
            out, lse = _FWD(_rows(q_c, blk.q_rows, seq), _rows(k_c, blk.kv_rows, seq),
                            _rows(v_c, blk.kv_rows, seq), causal=blk.causal, **cfg.op,
                            **blk.extra)
            merge_(_rows(out_acc, blk.q_rows, seq), _rows(lse_acc, blk.q_rows, -1), out, lse)
        if pending is not None:
            kv = tuple(pending.wait())
    return out_acc.to(q.dtype), lse_acc.to(torch.float32)


def _backward(dout, dlse, q, k, v, out, lse, cfg):
    acc = accumulator_dtype(q.dtype)
    seq = cfg.plan.seq_dim
    dq_acc = torch.zeros(q.shape, dtype=acc, device=q.device)
    # The bwd op returns gradients in the input dtype. In 16 bits, P blocks rounded each and
    # summed err up to ~sqrt(P) times one rounding (dV at P = 2 measured 2-3x single-process
    # flashattn's error against float64, over the 2x target), so with more than one block the
    # blocks run in float32: their gradients are exact partial sums, rounded once at the end.
    # K/V still travel in their own dtype. Stage 2: fp32 partial gradients from the op itself.
    compute = acc if cfg.world > 1 else q.dtype
    dout, out, q_c = (t.to(compute) for t in (dout, out, q))
    kv, pending_dkv = (k, v), None
    for step in range(cfg.world):
        pending_kv = (RingStep(cfg.group, cfg.world, cfg.rank, kv, _TAG_KV_BACKWARD)
                      if step + 1 < cfg.world and cfg.communicate else None)
        k_c, v_c = (t.to(compute) for t in kv)
        parts = []
        for blk in cfg.plan.blocks((cfg.rank - step) % cfg.world):
            qr, kr = blk.q_rows, blk.kv_rows
            dq, dk, dv, _ = _BWD(_rows(dout, qr, seq), _rows(out, qr, seq), _rows(lse, qr, -1),
                                 _rows(dlse, qr, -1), _rows(q_c, qr, seq), _rows(k_c, kr, seq),
                                 _rows(v_c, kr, seq), causal=blk.causal, **cfg.op, **blk.extra)
            _rows(dq_acc, qr, seq).add_(dq)
            parts.append((kr, dk, dv))
        # The dK/dV accumulator of the K/V held now arrives from the previous rank while this
        # step's blocks compute; at step 0 it is this rank's own, fresh.
        if pending_dkv is None:
            dk_acc, dv_acc = (torch.zeros(t.shape, dtype=acc, device=t.device) for t in (k, v))
        else:
            dk_acc, dv_acc = pending_dkv.wait()
        for kr, dk, dv in parts:
            _rows(dk_acc, kr, seq).add_(dk)
            _rows(dv_acc, kr, seq).add_(dv)
        if cfg.world > 1 and cfg.communicate:  # on to the next holder; at the end, the owner
            pending_dkv = RingStep(cfg.group, cfg.world, cfg.rank, (dk_acc, dv_acc), _TAG_DKV)
        if pending_kv is not None:
            kv = tuple(pending_kv.wait())
    if pending_dkv is not None:
        dk_acc, dv_acc = pending_dkv.wait()
    return dq_acc.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cfg):
        out, lse = _forward(q, k, v, cfg)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg = cfg
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @once_differentiable  # a double backward through the ring is an error, not a silent zero
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        # out.sum().backward() hands in an expanded (stride 0) dout; the op reads it in place.
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dlse = None if dlse is None else dlse.contiguous()
        dq, dk, dv = _backward(dout, dlse, q, k, v, out, lse, ctx.cfg)
        return dq, dk, dv, None


def _stage2(fn, argument, value, why):
    return NotImplementedError(
        f"{fn}: {argument}={value} is not supported by the ring yet: {why} The kernels "
        f"do not take a block's global row and key offsets yet (a diagonal offset; issue 32, "
        f"stage 2), and the ring will not silently ignore it. ulysses_flash_attn_func, which "
        f"attends to whole sequences, supports window_size and alibi_slopes.")


def _op_arguments(fn, dropout_p, softmax_scale, window_size, softcap, alibi_slopes,
                  deterministic, layout):
    _group.check_layout(fn, layout)
    if _group.real(fn, "dropout_p", dropout_p) != 0.0:
        raise _stage2(fn, "dropout_p", repr(dropout_p), "the dropout mask is a function of each "
                      "entry's global (row, key) position, and a block only knows its local "
                      "ones.")
    if _group.window_pair(fn, window_size) != (-1, -1):
        raise _stage2(fn, "window_size", repr(window_size), "a block off the diagonal needs the "
                      "window measured from the global diagonal.")
    if alibi_slopes is not None:
        raise _stage2(fn, "alibi_slopes", "<a tensor>", "the bias -slope*|i - j| needs each "
                      "block's global distance between query and key.")
    op = {}
    if softmax_scale is not None:
        op["softmax_scale"] = _group.real(fn, "softmax_scale", softmax_scale)
    softcap = _group.real(fn, "softcap", softcap)
    if softcap != 0.0:
        op["softcap"] = softcap
    if deterministic:
        op["deterministic"] = True
    return op


def _result(out, lse, return_attn_probs):
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_func(q, k, v, group=None, *, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                         deterministic=False, return_attn_probs=False, layout="zigzag"):
    """flash_attn_func over a sequence sharded across the ranks of `group` (shard's layout).

    q: (batch, seqlen_local, heads, head_dim), k, v: (batch, seqlen_local_k, heads_k, head_dim),
    this rank's shards. The result is this rank's shard of flash_attn_func on the whole
    sequence: out (batch, seqlen_local, heads, head_dim), and with return_attn_probs
    (out, lse, None), lse (batch, heads, seqlen_local) float32, differentiable.
    causal (aligned on the global diagonal; q and k the same length), softcap, GQA/MQA (only
    the kv heads travel), softmax_scale and deterministic are supported; dropout_p, window_size
    and alibi_slopes raise NotImplementedError (they need kernel offsets, issue 32 stage 2).
    """
    fn = "ring_flash_attn_func"
    group, world, rank = _group.resolve(fn, group)
    op = _op_arguments(fn, dropout_p, softmax_scale, window_size, softcap, alibi_slopes,
                       deterministic, layout)
    _group.check_qkv(fn, q, k, v, varlen=False)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if causal and seqlen_q != seqlen_k:
        raise ValueError(f"{fn}: with causal=True q and k must have the same local sequence "
                         f"length (self-attention), got {seqlen_q} and {seqlen_k}")
    pieces = _group.chunks_per_rank(layout)
    for name, length in (("q", seqlen_q), ("k", seqlen_k)):
        if length % pieces != 0:
            raise ValueError(f"{fn}: {name}'s local sequence length is {length}; with "
                             f"layout={layout!r} a shard is two equal chunks, so it must be "
                             f"even (shard the sequence with flashattn.distributed.shard)")
    plan = _Plan(world, rank, layout, bool(causal), seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    out, lse = _RingAttention.apply(q, k, v, _Config(group, world, rank, plan, op))
    return _result(out, lse, return_attn_probs)


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, group=None, *, dropout_p=0.0,
                                softmax_scale=None, causal=False, window_size=(-1, -1),
                                softcap=0.0, alibi_slopes=None, deterministic=False,
                                return_attn_probs=False, layout="zigzag"):
    """flash_attn_varlen_func over a packed batch whose every sequence is sharded across the
    ranks (shard with cu_seqlens=, dim=0).

    q: (total_local, heads, head_dim), k, v: (total_local, heads_k, head_dim). cu_seqlens
    (int32, batch + 1) and max_seqlen describe the GLOBAL batch, the same on every rank; each
    sequence's length must divide into the layout's chunks. Returns this rank's rows of
    flash_attn_varlen_func on the global batch, and with return_attn_probs (out, lse, None),
    lse (heads, total_local). Features as ring_flash_attn_func.
    """
    fn = "ring_flash_attn_varlen_func"
    group, world, rank = _group.resolve(fn, group)
    op = _op_arguments(fn, dropout_p, softmax_scale, window_size, softcap, alibi_slopes,
                       deterministic, layout)
    _group.check_qkv(fn, q, k, v, varlen=True)
    sequences = seqlens(fn, cu_seqlens)
    check_varlen_lengths(fn, sequences, world, layout)
    total = sequences[-1][0] + sequences[-1][1] if sequences else 0
    for name, t in (("q", q), ("k", k)):
        if t.shape[0] * world != total:
            raise ValueError(f"{fn}: {name} must hold this rank's share of the global batch, "
                             f"cu_seqlens[-1] / {world} = {total / world:g} rows, got "
                             f"{t.shape[0]}")
    longest = max((length for _, length in sequences), default=0)
    try:
        bound = operator.index(max_seqlen)
    except TypeError:
        bound = None
    if bound is None or bound < longest:
        raise ValueError(f"{fn}: max_seqlen must be an int at least the longest global "
                         f"sequence ({longest}), got {max_seqlen!r}")
    local = [(start // world, length // world) for start, length in sequences]
    plan = _Plan(world, rank, layout, bool(causal), local_sequences=local, device=q.device)
    out, lse = _RingAttention.apply(q, k, v, _Config(group, world, rank, plan, op))
    return _result(out, lse, return_attn_probs)
