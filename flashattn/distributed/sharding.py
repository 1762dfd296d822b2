"""shard / unshard: cut a global sequence into the ranks' pieces and put it back together.

Layouts, with P ranks:
  "zigzag"      the sequence is cut into 2P equal chunks; rank r holds chunks r and 2P-1-r, in
                that order (torch context_parallel's head-tail order). Under a causal mask every
                rank then has the same amount of work.
  "contiguous"  the sequence is cut into P equal chunks; rank r holds chunk r.
A varlen batch (cu_seqlens, dim=0) is sharded one sequence at a time with the same layout, so
rank r's local batch is again a packed batch, with cu_seqlens // P.
"""
import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from . import _group


def chunk_ids(layout, world, rank):
    """The global chunks rank `rank` holds, in its local order."""
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)


def seqlens(fn, cu_seqlens):
    """The sequences' (start, length) of an int cu_seqlens (B + 1,), read on the host."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"{fn}: cu_seqlens must be a 1-D integer tensor (batch + 1,), got "
                         f"{cu_seqlens!r}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex():
        raise ValueError(f"{fn}: cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{fn}: cu_seqlens must start at 0 and be non-decreasing, got {cu}")
    return [(a, b - a) for a, b in zip(cu, cu[1:])]


def check_varlen_lengths(fn, sequences, world, layout):
    for b, (_, length) in enumerate(sequences):
        _group.check_divides(fn, f"the length of sequence {b} (cu_seqlens[{b + 1}] - "
                             f"cu_seqlens[{b}])", length, world, layout)


def _pieces(x, dim, sequences, world, rank, layout):
    """Rank `rank`'s pieces of the global x, in local order: per sequence, its chunks."""
    per = world * _group.chunks_per_rank(layout)
    pieces = []
    for start, length in sequences:
        size = length // per
        pieces += [x.narrow(dim, start + c * size, size) for c in chunk_ids(layout, world, rank)]
    return pieces


def _check_dim(fn, x, dim, cu_seqlens):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a tensor, got {type(x).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{fn}: dim must index a dimension of x (shape {tuple(x.shape)}), "
                         f"got {dim}")
    dim = dim % x.dim()
    if cu_seqlens is not None and dim != 0:
        raise ValueError(f"{fn}: with cu_seqlens the sequences are packed along dim 0 "
                         f"(total, ...), so dim must be 0, got {dim}")
    return dim


def _layout_sequences(fn, x, dim, cu_seqlens, world, layout, local):
    """The (start, length) of each sequence in x, checked to divide. local: x is a shard."""
    _group.check_layout(fn, layout)
    if cu_seqlens is None:
        length = x.shape[dim] * (world if local else 1)
        _group.check_divides(fn, f"the sequence length (x.shape[{dim}])", length, world, layout)
        sequences = [(0, length)]
    else:
        sequences = seqlens(fn, cu_seqlens)
        check_varlen_lengths(fn, sequences, world, layout)
        total = sequences[-1][0] + sequences[-1][1] if sequences else 0
        have = x.shape[0] * (world if local else 1)
        if have != total:
            what = "x.shape[0] times the world size" if local else "x.shape[0]"
            raise ValueError(f"{fn}: cu_seqlens[-1] ({total}) must equal {what} ({have})")
    if local:
        sequences = [(start // world, length // world) for start, length in sequences]
    return sequences


def shard(x, group=None, *, dim=1, layout="zigzag", cu_seqlens=None):
    """This rank's piece of the global tensor x (the same on every rank) along dim.

    x: e.g. (batch, seqlen, heads, head_dim) with dim=1, or a packed varlen batch
    (total, heads, head_dim) with dim=0 and the global cu_seqlens (each sequence's length
    must divide into the layout's chunks). Returns a new tensor; differentiable."""
    fn = "flashattn.distributed.shard"
    group, world, rank = _group.resolve(fn, group)
    dim = _check_dim(fn, x, dim, cu_seqlens)
    sequences = _layout_sequences(fn, x, dim, cu_seqlens, world, layout, local=False)
    return torch.cat(_pieces(x, dim, sequences, world, rank, layout), dim)


def _assemble(shards, dim, sequences, world, layout):
    """The global tensor from every rank's shard; sequences: the local (start, length)."""
    per_rank = _group.chunks_per_rank(layout)
    per = world * per_rank
    parts = []
    for start, length in sequences:
        size = length // per_rank
        chunks = [None] * per
        for rank, local in enumerate(shards):
            for i, c in enumerate(chunk_ids(layout, world, rank)):
                chunks[c] = local.narrow(dim, start + i * size, size)
        parts += chunks
    return torch.cat(parts, dim)


class _Unshard(torch.autograd.Function):
    """all_gather of the shards, then reordered. Backward: the gradients of every rank's copy
    of the global tensor are summed (all_reduce) and this rank's piece is taken, as for
    torch.distributed.nn's all_gather."""

    @staticmethod
    def forward(ctx, x, group, world, rank, dim, sequences, layout):
        ctx.args = group, world, rank, dim, sequences, layout
        x = x.contiguous()
        shards = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(shards, x, group=group)
        return _assemble(shards, dim, sequences, world, layout)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        group, world, rank, dim, sequences, layout = ctx.args
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=group)
        global_sequences = [(start * world, length * world) for start, length in sequences]
        return (torch.cat(_pieces(grad, dim, global_sequences, world, rank, layout), dim),
                None, None, None, None, None, None)


def unshard(x, group=None, *, dim=1, layout="zigzag", cu_seqlens=None):
    """The global tensor from every rank's shard x (the inverse of shard), on every rank.

    cu_seqlens is the global one, as given to shard. Differentiable: the gradient of a shard
    is the sum over ranks of the gradients of their copies of the result, at its rows."""
    fn = "flashattn.distributed.unshard"
    group, world, rank = _group.resolve(fn, group)
    dim = _check_dim(fn, x, dim, cu_seqlens)
    sequences = _layout_sequences(fn, x, dim, cu_seqlens, world, layout, local=True)
    return _Unshard.apply(x, group, world, rank, dim, sequences, layout)
