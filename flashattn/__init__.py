"""flashattn: exact, IO-aware softmax attention for PyTorch (FlashAttention)."""
from . import _C  # noqa: F401  loads the library; its TORCH_LIBRARY blocks register the ops
