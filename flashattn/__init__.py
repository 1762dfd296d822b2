"""flashattn: exact, IO-aware softmax attention for PyTorch (FlashAttention).

Two front ends reach the same kernels (torch.ops.flashattn.fwd / bwd):
  flash_attn_func               FlashAttention-2's signature, layout (batch, seqlen, heads, head_dim)
  scaled_dot_product_attention  F.scaled_dot_product_attention's signature, layout (batch, heads, seqlen, head_dim)
"""
from . import _C  # noqa: F401  loads the library; its TORCH_LIBRARY blocks register the ops
from . import ops  # noqa: F401  fake kernels and autograd
from .interface import flash_attn_func, scaled_dot_product_attention

__version__ = "0.1.0"
__all__ = ["flash_attn_func", "scaled_dot_product_attention", "__version__"]
