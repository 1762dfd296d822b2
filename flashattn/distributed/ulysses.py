"""Ulysses (DeepSpeed's) context parallelism: an all-to-all turns the ranks' sequence shards
into head shards (every rank gets the whole sequence for heads/P of the heads), flashattn
attends to whole sequences, and a second all-to-all turns the result back into sequence shards.
Because every rank sees whole sequences, every flashattn feature that acts within a head works
unchanged: causal, window, softcap, ALiBi (each rank takes its heads' slopes), GQA/MQA. Dropout,
whose mask is a function of (batch, head, row, key), gets the rank's first head as the call's
head offset (block_offsets, csrc/params.h), so it drops what one process drops. The heads of q
and of k/v must divide by P."""
import torch
import torch.distributed as dist

from . import _group
from .ring import _result
from .sharding import chunk_ids


def _seq_to_heads(x, group, world):
    """(B, S_local, H, D) on each rank -> (B, P*S_local, H/P, D): rank r's heads
    [r*H/P, (r+1)*H/P) of every rank's shard, in rank order."""
    batch, seqlen, heads, dim = x.shape
    send = x.reshape(batch, seqlen, world, heads // world, dim).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 0, 2, 3, 4).reshape(batch, world * seqlen, heads // world, dim)


def _heads_to_seq(y, group, world):
    """The inverse of _seq_to_heads: (B, P*S_local, H/P, D) -> (B, S_local, H, D)."""
    batch, total, heads, dim = y.shape
    send = y.reshape(batch, world, total // world, heads, dim).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(batch, total // world, world * heads, dim)


class _AllToAll(torch.autograd.Function):
    """Sequence shards -> head shards (to_heads) or back; the backward is the other way."""

    @staticmethod
    def forward(ctx, x, group, world, to_heads):
        ctx.args = group, world, to_heads
        return (_seq_to_heads if to_heads else _heads_to_seq)(x, group, world)

    @staticmethod
    def backward(ctx, grad):
        group, world, to_heads = ctx.args
        # Through apply, so that the backward is differentiable in turn (double backward).
        return _AllToAll.apply(grad, group, world, not to_heads), None, None, None


def _natural_order(layout, world, seqlen_local, device):
    """Row indices that put the rank-ordered gathered sequence into the global order (None for
    contiguous, whose rank order is the global one)."""
    if layout == "contiguous" or world == 1:
        return None
    pieces = _group.chunks_per_rank(layout)
    size = seqlen_local // pieces
    position = {}
    for rank in range(world):
        for i, chunk in enumerate(chunk_ids(layout, world, rank)):
            position[chunk] = rank * pieces + i
    order = [position[c] * size + t for c in range(world * pieces) for t in range(size)]
    return torch.tensor(order, dtype=torch.long, device=device)


def _inverse(order):
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


def ulysses_flash_attn_func(q, k, v, group=None, *, dropout_p=0.0, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                            deterministic=False, return_attn_probs=False, layout="zigzag"):
    """flash_attn_func over a sequence sharded across the ranks of `group` (shard's layout), by
    all-to-alls over the heads.

    q: (batch, seqlen_local, heads, head_dim), k, v: (batch, seqlen_local_k, heads_k,
    head_dim); heads and heads_k must be multiples of the group's size. alibi_slopes: the
    global (heads,) or (batch, heads) slopes. Returns this rank's shard of flash_attn_func's
    out, and with return_attn_probs (out, lse, None), lse (batch, heads, seqlen_local),
    differentiable. dropout_p drops the entries one process drops under the same torch seed.
    """
    fn = "ulysses_flash_attn_func"
    group, world, rank = _group.resolve(fn, group)
    _group.check_layout(fn, layout)
    dropout_p = _group.real(fn, "dropout_p", dropout_p)
    left, right = _group.window_pair(fn, window_size)
    _group.check_qkv(fn, q, k, v, varlen=False)
    heads, heads_kv = q.shape[2], k.shape[2]
    for name, count in (("q", heads), ("k and v", heads_kv)):
        if count % world != 0:
            raise ValueError(f"{fn}: the heads of {name} ({count}) must divide by the group's "
                             f"size ({world}): each rank attends to heads/{world} of them")
    pieces = _group.chunks_per_rank(layout)
    for name, t in (("q", q), ("k", k)):
        if t.shape[1] % pieces != 0:
            raise ValueError(f"{fn}: {name}'s local sequence length is {t.shape[1]}; with "
                             f"layout={layout!r} a shard is two equal chunks, so it must be "
                             f"even (shard the sequence with flashattn.distributed.shard)")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.shape[-1] != heads:
            raise ValueError(f"{fn}: alibi_slopes must be the global slopes, (heads,) or "
                             f"(batch, heads) with heads = {heads}, got "
                             f"{getattr(alibi_slopes, 'shape', alibi_slopes)}")
        share = heads // world
        alibi_slopes = alibi_slopes[..., rank * share:(rank + 1) * share]

    q_h, k_h, v_h = (_AllToAll.apply(t, group, world, True) for t in (q, k, v))
    order_q = _natural_order(layout, world, q.shape[1], q.device)
    order_k = _natural_order(layout, world, k.shape[1], q.device)
    if order_q is not None:
        q_h = q_h.index_select(1, order_q)
        k_h, v_h = k_h.index_select(1, order_k), v_h.index_select(1, order_k)
    op = dict(softmax_scale=None if softmax_scale is None
              else _group.real(fn, "softmax_scale", softmax_scale),
              causal=bool(causal), window_left=left, window_right=right,
              softcap=_group.real(fn, "softcap", softcap), alibi_slopes=alibi_slopes,
              deterministic=bool(deterministic))
    if dropout_p != 0.0:  # one [seed, offset] per call, as flash_attn_func draws it
        op.update(dropout_p=dropout_p, rng_state=torch.ops.flashattn.dropout_rng_state(q))
    # This rank's heads start at global head rank * heads / P; rows and keys are the whole
    # sequence's, its diagonal flash_attn_func's (bottom-right).
    batch, seqlen_q, seqlen_k = q.shape[0], q_h.shape[1], k_h.shape[1]
    offsets = torch.tensor([[0, 0, rank * (heads // world), seqlen_k - seqlen_q, b]
                            for b in range(batch)], dtype=torch.int32).reshape(-1, 5)
    out, lse = torch.ops.flashattn.fwd(q_h, k_h, v_h, block_offsets=offsets.to(q.device), **op)
    if order_q is not None:
        back = _inverse(order_q)
        out, lse = out.index_select(1, back), lse.index_select(2, back)
    out = _AllToAll.apply(out, group, world, False)
    if not return_attn_probs:
        return out
    # lse (B, H/P, S) as (B, S, H/P, 1) through the same all-to-all, then (B, H, S_local).
    lse = _AllToAll.apply(lse.transpose(1, 2).unsqueeze(-1), group, world, False)
    return _result(out, lse.squeeze(-1).transpose(1, 2), True)
