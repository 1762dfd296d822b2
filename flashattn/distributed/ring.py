"""Ring attention: K and V travel around the ranks; each rank attends its local queries to every
rank's keys, one block per step, and merges the blocks by their LSE (merge.py).

Which blocks a step computes. At step s rank r holds the K/V of rank src = (r - s) mod P. A
rank's shard of a sequence is one or two pieces of it (zigzag: chunks r and 2P-1-r; contiguous:
chunk r; adjacent chunks are one piece, as zigzag's at P = 1). Each (query piece, key piece)
pair is one call of the op, told where its rows and keys sit in the whole sequence
(block_offsets, csrc/params.h), so that causal, window, ALiBi and dropout act on global
positions exactly as one process's call does. A pair that no query of it sees (above the
causal diagonal, outside the window) is skipped; with zigzag and causal every rank computes
the same amount. A varlen batch makes one call per pair of piece kinds for all its sequences:
each sequence is split into sub-sequences so that the pair's query rows meet its keys and the
other rows meet none (their out 0 and LSE -inf merge as nothing, their gradients are zero).
The blocks compute from the inputs' dtype; with P > 1 a 16-bit ring takes their partial outputs
in float32 (the op's internal out_fp32), merges them in float32 and rounds once.

Backward: every block's backward gets the global lse and D_i = rowsum(dO_i * O_i) of the
global (merged) out, so its P_ij are the global probabilities and its dQ, dK, dV are exactly its
share. dQ accumulates locally, dK and dV in a float32 accumulator that travels around the ring
with K/V and reaches its owner after P steps; each is rounded to the input dtype once. A 16-bit
ring's blocks compute from the 16-bit inputs and return float32 gradients (the op's internal
grads_fp32). Dropout draws one [seed, offset] per call, which every block and the backward
reuse.
"""
import operator
from typing import NamedTuple, Optional

import torch
from torch.autograd.function import once_differentiable

from . import _group
from .comm import RingStep
from .merge import accumulator_dtype, merge_
from .sharding import check_varlen_lengths, chunk_ids, seqlens

_FWD = torch.ops.flashattn.fwd.default
_BWD = torch.ops.flashattn.bwd.default
_TAG_KV, _TAG_KV_BACKWARD, _TAG_DKV = 11, 12, 13
_16_BIT = (torch.float16, torch.bfloat16)


class _Block(NamedTuple):
    q_rows: Optional[tuple]   # (start, length) of the local query rows, None: all of them
    kv_rows: Optional[tuple]  # the same for the keys
    extra: dict               # the block's own op arguments: block_offsets, varlen, ALiBi


def _rows(t, rows, dim):
    return t if rows is None or t is None else t.narrow(dim, *rows)


class _Piece(NamedTuple):
    """A run of a rank's shard that is contiguous in the whole sequence, in chunks."""
    local: int   # its first chunk in the shard
    chunks: int
    whole: int   # its first chunk in the whole sequence


def pieces(layout, world, rank):
    """Rank `rank`'s shard of a sequence as pieces, adjacent chunks joined."""
    out = []
    for i, chunk in enumerate(chunk_ids(layout, world, rank)):
        last = out[-1] if out else None
        if last is not None and last.whole + last.chunks == chunk:
            out[-1] = _Piece(last.local, last.chunks + 1, last.whole)
        else:
            out.append(_Piece(i, 1, chunk))
    return out


def sees(q_first, q_count, k_first, k_count, window, diagonal):
    """Whether some query of rows [q_first, +q_count) of the whole sequence sees a key of
    [k_first, +k_count) under window (left, right) (causal: right 0), whose diagonal is
    row + diagonal. The rows' visible key ranges overlap from row to row, so the union is
    one range."""
    if q_count == 0 or k_count == 0:
        return False
    left, right = window
    if right >= 0 and k_first > q_first + q_count - 1 + diagonal + right:
        return False
    if left >= 0 and k_first + k_count - 1 < q_first + diagonal - left:
        return False
    return True


class _Plan:
    """The blocks each step computes (see the module's docstring), dense or varlen."""

    def __init__(self, world, rank, layout, window, seqlen_q=None, seqlen_k=None, batch=None,
                 local_sequences=None, alibi_slopes=None, device=None):
        self.world, self.rank, self.layout, self.window = world, rank, layout, window
        self.varlen = local_sequences is not None
        self.seq_dim = 0 if self.varlen else 1
        self.chunks = world * _group.chunks_per_rank(layout)  # of each whole sequence
        self.q_pieces = pieces(layout, world, rank)
        self.alibi_slopes, self.device = alibi_slopes, device
        self._blocks = {}
        if self.varlen:
            self.sequences = local_sequences
        else:
            self.seqlen_q, self.seqlen_k, self.batch = seqlen_q, seqlen_k, batch

    def _offsets(self, rows):
        return torch.tensor(rows, dtype=torch.int32).reshape(-1, 5).to(self.device)

    def blocks(self, src):
        # The forward and the backward ask for the same steps: their offsets (and cu_seqlens)
        # are built, and on a GPU copied over, once.
        if src not in self._blocks:
            self._blocks[src] = self._make_blocks(src)
        return self._blocks[src]

    def _make_blocks(self, src):
        k_pieces = pieces(self.layout, self.world, src)
        pairs = [(qp, kp) for qp in self.q_pieces for kp in k_pieces]
        make = self._varlen_block if self.varlen else self._dense_block
        return [blk for blk in (make(qp, kp, k_pieces) for qp, kp in pairs) if blk is not None]

    def _dense_block(self, qp, kp, _):
        cq = self.seqlen_q // _group.chunks_per_rank(self.layout)  # rows per chunk
        ck = self.seqlen_k // _group.chunks_per_rank(self.layout)
        # flash_attn_func's diagonal: bottom-right on the whole sequence.
        diagonal = (self.seqlen_k - self.seqlen_q) * self.world
        q_first, k_first = qp.whole * cq, kp.whole * ck
        if not sees(q_first, qp.chunks * cq, k_first, kp.chunks * ck, self.window, diagonal):
            return None
        offsets = self._offsets([[q_first, k_first, 0, diagonal, b] for b in range(self.batch)])
        extra = dict(block_offsets=offsets)
        if self.alibi_slopes is not None:
            extra["alibi_slopes"] = self.alibi_slopes
        return _Block((qp.local * cq, qp.chunks * cq), (kp.local * ck, kp.chunks * ck), extra)

    def _varlen_block(self, qp, kp, k_pieces):
        """One call for pair (qp, kp) over every sequence: sub-sequences (query rows, keys)
        that tile both the local queries and the local keys, in order, where only qp's rows
        meet kp's keys."""
        lengths_q, lengths_k, offsets, owner = [], [], [], []
        any_sees = False

        def sub(rows, keys, row0=0, key0=0, b=0):
            lengths_q.append(rows)
            lengths_k.append(keys)
            offsets.append([row0, key0, 0, 0, b])  # q and k share cu_seqlens: diagonal 0
            owner.append(b)
        for b, (_, length) in enumerate(self.sequences):
            size = length // (self.chunks // self.world) if length else 0  # rows per chunk
            for p in self.q_pieces:
                if p.local < qp.local:
                    sub(p.chunks * size, 0, b=b)
            for p in k_pieces:
                if p.local < kp.local:
                    sub(0, p.chunks * size, b=b)
            q_first, k_first = qp.whole * size, kp.whole * size
            any_sees = any_sees or sees(q_first, qp.chunks * size, k_first, kp.chunks * size,
                                        self.window, 0)
            sub(qp.chunks * size, kp.chunks * size, q_first, k_first, b)
            for p in self.q_pieces:
                if p.local > qp.local:
                    sub(p.chunks * size, 0, b=b)
            for p in k_pieces:
                if p.local > kp.local:
                    sub(0, p.chunks * size, b=b)
        if not any_sees:
            return None

        def cumulative(lengths):
            cu = [0]
            for n in lengths:
                cu.append(cu[-1] + n)
            return torch.tensor(cu, dtype=torch.int32, device=self.device)
        extra = dict(cu_seqlens_q=cumulative(lengths_q), cu_seqlens_k=cumulative(lengths_k),
                     max_seqlen_q=max(lengths_q, default=0),
                     max_seqlen_k=max(lengths_k, default=0), block_offsets=self._offsets(offsets))
        slopes = self.alibi_slopes
        if slopes is not None:
            # Per-sequence slopes follow each sub-sequence's sequence.
            extra["alibi_slopes"] = (slopes if slopes.dim() == 1 else slopes.index_select(
                0, torch.tensor(owner, dtype=torch.long, device=slopes.device)))
        return _Block(None, None, extra)


class _Config(NamedTuple):
    group: object
    world: int
    rank: int
    plan: _Plan
    op: dict  # the op arguments every block shares (scale, masks, softcap, dropout's seed)
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
    # The LSE merges in float64: in float32 its log-sum-exp of P blocks measured up to 2.07x
    # single-process flashattn's error at P = 4 (9e-7 against 4e-7). It is one number per row.
    lse_acc = torch.full(lse_shape, float("-inf"), dtype=torch.float64, device=q.device)
    # Partial outputs rounded to 16 bits each, then merged, measured up to 2.6x single-process
    # flashattn's error against float64 in bfloat16 (and through out, dK up to 2.2x), over the
    # 2x target. So with more than one block a 16-bit ring asks the op for its out in float32
    # (out_fp32: the blocks still compute from the 16-bit inputs), merges in float32 and
    # rounds once, at the end.
    partial = dict(out_fp32=True) if cfg.world > 1 and q.dtype in _16_BIT else {}
    kv = (k, v)
    for step in range(cfg.world):
        # Post the next step's transfer before computing this one, so that they overlap.
        pending = (RingStep(cfg.group, cfg.world, cfg.rank, kv, _TAG_KV)
                   if step + 1 < cfg.world and cfg.communicate else None)
        k_s, v_s = kv
        for blk in cfg.plan.blocks((cfg.rank - step) % cfg.world):
            out, lse = _FWD(_rows(q, blk.q_rows, seq), _rows(k_s, blk.kv_rows, seq),
                            _rows(v_s, blk.kv_rows, seq), **cfg.op, **blk.extra, **partial)
            merge_(_rows(out_acc, blk.q_rows, seq), _rows(lse_acc, blk.q_rows, -1), out, lse)
        if pending is not None:
            kv = tuple(pending.wait())
    # out_acc too: a 16-bit ring's backward takes D_i from the float32 out (_backward).
    return out_acc.to(q.dtype), lse_acc.to(torch.float32), out_acc


def _backward(dout, dlse, q, k, v, out, lse, cfg):
    """out: the merged out, float32 for a 16-bit ring with P > 1 (_forward's out_acc)."""
    acc = accumulator_dtype(q.dtype)
    seq = cfg.plan.seq_dim
    dq_acc = torch.zeros(q.shape, dtype=acc, device=q.device)
    block = {}
    if cfg.world > 1 and q.dtype in _16_BIT:
        # The blocks compute from the 16-bit dout, q and K/V and return float32 gradients
        # (grads_fp32), which add up in float32 and are rounded once: P blocks rounded each
        # and summed measured up to 2-3x single-process flashattn's error (dV, P = 2).
        # D_i = rowsum(dO_i * O_i) comes from the float32 merged out, not from the 16-bit
        # out: each bwd call would compute it from the out it is given, and the ring's 16-bit
        # out, rounded from its own float32 merge, differs in the last bit from one process's
        # in some entries, which moved dS = P * (dP - D) and with it dQ and dK as far from
        # float64 as single-process flashattn's own error (up to 2.6x it at the max entry on
        # small inputs). D_i folds into dlse (the op's D = rowsum(dout * out) - dlse) and the
        # blocks get out = 0, so that their D is exactly it.
        d = (dout.to(acc) * out).sum(-1).transpose(-1, -2)  # (..., S, H) -> lse's (..., H, S)
        dlse = (-d if dlse is None else dlse - d).contiguous()
        out = torch.zeros_like(dout)  # out's shape: v's head dim (MLA), not q's
        block = dict(grads_fp32=True)
    kv, pending_dkv = (k, v), None
    for step in range(cfg.world):
        pending_kv = (RingStep(cfg.group, cfg.world, cfg.rank, kv, _TAG_KV_BACKWARD)
                      if step + 1 < cfg.world and cfg.communicate else None)
        k_s, v_s = kv
        parts = []
        for blk in cfg.plan.blocks((cfg.rank - step) % cfg.world):
            qr, kr = blk.q_rows, blk.kv_rows
            dq, dk, dv, _ = _BWD(_rows(dout, qr, seq), _rows(out, qr, seq), _rows(lse, qr, -1),
                                 _rows(dlse, qr, -1), _rows(q, qr, seq), _rows(k_s, kr, seq),
                                 _rows(v_s, kr, seq), **cfg.op, **blk.extra, **block)
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
        out, lse, out_acc = _forward(q, k, v, cfg)
        # A 16-bit ring with P > 1 keeps its float32 out for the backward's D_i (_backward).
        saved = out_acc if cfg.world > 1 and q.dtype in _16_BIT else out
        ctx.save_for_backward(q, k, v, saved, lse)
        ctx.cfg = cfg
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @once_differentiable  # a double backward through the ring is an error, not a silent zero
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        # out.sum().backward() hands in an expanded (stride 0) dout; the op reads it in place.
        dout = torch.zeros(out.shape, dtype=q.dtype, device=q.device) if dout is None else (
            dout.contiguous())
        dlse = None if dlse is None else dlse.contiguous()
        dq, dk, dv = _backward(dout, dlse, q, k, v, out, lse, ctx.cfg)
        return dq, dk, dv, None


def _op_arguments(fn, dropout_p, softmax_scale, causal, window_size, softcap,
                  deterministic, layout):
    """The op arguments every block shares, and the window (left, right) the plan skips by."""
    _group.check_layout(fn, layout)
    left, right = _group.window_pair(fn, window_size)
    for name, value in (("window_size[0]", left), ("window_size[1]", right)):
        if value < -1:
            raise ValueError(f"{fn}: {name} must be -1 (unbounded) or >= 0, got {value}")
    op = dict(causal=bool(causal), window_left=left, window_right=right)
    if softmax_scale is not None:
        op["softmax_scale"] = _group.real(fn, "softmax_scale", softmax_scale)
    softcap = _group.real(fn, "softcap", softcap)
    if softcap != 0.0:
        op["softcap"] = softcap
    if deterministic:
        op["deterministic"] = True
    dropout_p = _group.real(fn, "dropout_p", dropout_p)
    if dropout_p != 0.0:
        op["dropout_p"] = dropout_p
    return op, (left, 0 if causal else right)


def _draw_dropout_seed(op, q):
    """One [seed, offset] per call, as flash_attn_func draws it, once the arguments are checked:
    under the same torch seed every rank (and one process) draws the same, and the blocks drop
    at global positions. The backward reuses it."""
    if "dropout_p" in op:
        op["rng_state"] = torch.ops.flashattn.dropout_rng_state(q)


def _check_alibi(fn, alibi_slopes, heads, batch):
    if alibi_slopes is None:
        return None
    if (not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dim() not in (1, 2)
            or alibi_slopes.shape[-1] != heads
            or (alibi_slopes.dim() == 2 and alibi_slopes.shape[0] != batch)):
        raise ValueError(f"{fn}: alibi_slopes must be float32 of shape ({heads},) or "
                         f"({batch}, {heads}) (heads, or batch x heads), got "
                         f"{getattr(alibi_slopes, 'shape', alibi_slopes)!r}")
    return alibi_slopes


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
    causal and window_size (aligned bottom-right on the whole sequence, as flash_attn_func,
    also where q and k differ in length: each block is told the whole sequence's diagonal),
    alibi_slopes, dropout_p (the entries one process drops under the same torch seed), softcap,
    GQA/MQA (only the kv heads travel), softmax_scale and deterministic are supported.
    """
    fn = "ring_flash_attn_func"
    group, world, rank = _group.resolve(fn, group)
    _group.check_qkv(fn, q, k, v, varlen=False)
    op, window = _op_arguments(fn, dropout_p, softmax_scale, causal, window_size, softcap,
                               deterministic, layout)
    slopes = _check_alibi(fn, alibi_slopes, q.shape[2], q.shape[0])
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    pieces = _group.chunks_per_rank(layout)
    for name, length in (("q", seqlen_q), ("k", seqlen_k)):
        if length % pieces != 0:
            raise ValueError(f"{fn}: {name}'s local sequence length is {length}; with "
                             f"layout={layout!r} a shard is two equal chunks, so it must be "
                             f"even (shard the sequence with flashattn.distributed.shard)")
    _draw_dropout_seed(op, q)
    plan = _Plan(world, rank, layout, window, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                 batch=q.shape[0], alibi_slopes=slopes, device=q.device)
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
    _group.check_qkv(fn, q, k, v, varlen=True)
    op, window = _op_arguments(fn, dropout_p, softmax_scale, causal, window_size, softcap,
                               deterministic, layout)
    sequences = seqlens(fn, cu_seqlens)
    slopes = _check_alibi(fn, alibi_slopes, q.shape[1], len(sequences))
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
    _draw_dropout_seed(op, q)
    plan = _Plan(world, rank, layout, window, local_sequences=local, alibi_slopes=slopes,
                 device=q.device)
    out, lse = _RingAttention.apply(q, k, v, _Config(group, world, rank, plan, op))
    return _result(out, lse, return_attn_probs)
