"""flashattn: exact, IO-aware softmax attention for PyTorch (FlashAttention).

Two kinds of front end reach the same kernels (torch.ops.flashattn.fwd / bwd):
  flash_attn_func               FlashAttention-2's signature, layout (batch, seqlen, heads, head_dim),
  flash_attn_qkvpacked_func     and its packed variants, which read q, k, v from one tensor
  flash_attn_kvpacked_func
  flash_attn_varlen_func        the same over variable-length batches packed without padding
  flash_attn_varlen_qkvpacked_func, flash_attn_varlen_kvpacked_func
  scaled_dot_product_attention  F.scaled_dot_product_attention's signature, layout (batch, heads, seqlen, head_dim)
  flash_attn_with_kvcache       one decoding step over a (paged) KV cache, appended in place
"""
import torch  # noqa: F401  first: _C links against libtorch/libc10, which torch's import loads

from . import _C  # noqa: F401  loads the library; its TORCH_LIBRARY blocks register the ops
from . import _ops  # noqa: F401  fake kernels (autograd is registered in C++)
from . import _sdpa_impl  # noqa: F401  registers "flashattn" with torch.nn.attention
from ._interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, scaled_dot_product_attention)
from ._kvcache import flash_attn_with_kvcache

from ._version import __version__
__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "scaled_dot_product_attention", "flash_attn_with_kvcache",
           "__version__"]
