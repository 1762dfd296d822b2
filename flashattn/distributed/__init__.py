"""Context parallelism on torch.distributed: one sequence, sharded across the ranks of a
process group, attended to exactly as flash_attn_func / flash_attn_varlen_func would on the
whole sequence.

  shard, unshard                 the layouts ("zigzag": rank r holds chunks r and 2P-1-r of 2P;
                                 "contiguous": chunk r of P), dense or varlen
  ring_flash_attn_func           K/V travel around a ring of P2P steps, overlapped with compute
  ring_flash_attn_varlen_func    the same over a packed batch of sequences, each sharded
  ulysses_flash_attn_func        all-to-all from sequence shards to head shards and back
"""
from .ring import ring_flash_attn_func, ring_flash_attn_varlen_func
from .sharding import shard, unshard
from .ulysses import ulysses_flash_attn_func

__all__ = ["shard", "unshard", "ring_flash_attn_func", "ring_flash_attn_varlen_func",
           "ulysses_flash_attn_func"]
