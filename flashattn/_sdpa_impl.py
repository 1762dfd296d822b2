"""flashattn behind torch.nn.functional.scaled_dot_product_attention, in unmodified models.

Importing flashattn registers an implementation named "flashattn" with torch >= 2.13's
torch.nn.attention.register_flash_attention_impl; it does not activate it:

    torch.nn.attention.activate_flash_attention_impl("flashattn")   # F.sdpa now runs flashattn
    torch.nn.attention.restore_flash_attention_impl()               # and now PyTorch again

While active, ATen's own flash-attention ops (and their backwards) run flashattn's kernels
(csrc/sdpa_impl.h): on CPU the op F.sdpa uses for masked and unmasked calls alike, on CUDA the
ops of F.sdpa's flash backend and of torch.nn.attention.varlen. A C++ dispatcher registration,
no Python on the way. Inputs flashattn cannot take raise an error that says so. The profiler
shows the kernels as flashattn::fwd / flashattn::bwd.
"""
import torch

from . import _C  # noqa: F401  the op that installs the kernels

NAME = "flashattn"


class _Active:
    """The handle torch keeps while the implementation is active."""

    def remove(self):
        torch.ops.flashattn._activate_sdpa_impl(False)


def _activate():
    torch.ops.flashattn._activate_sdpa_impl(True)
    return _Active()


def register():
    """Registers (not activates) the implementation; False where torch has no registry."""
    register_impl = getattr(torch.nn.attention, "register_flash_attention_impl", None)
    if register_impl is None:
        return False
    register_impl(NAME, register_fn=_activate)
    return True


REGISTERED = register()
