"""The one Python registration layer: fake (meta) kernels and autograd for torch.ops.flashattn.

The schemas themselves are defined once, in C++ (csrc/flashattn.cpp). Registering fake kernels
makes the ops traceable by torch.compile / torch.export; registering autograd makes them
trainable, including through the LSE output.
"""
import torch

from . import _C  # noqa: F401  the schemas must exist before we register against them


def _check_same_device(q, **others):
    # The real kernels check this too; the fake kernels must, or a mixed-device call would
    # dispatch to the fake (Meta) kernel and quietly "succeed".
    for name, t in others.items():
        if t is not None and t.device != q.device:
            raise RuntimeError(f"flashattn: {name} must be on the same device as q ({q.device}), "
                               f"got {t.device}")


@torch.library.register_fake("flashattn::fwd")
def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
              align_bottom_right, deterministic):
    _check_same_device(q, k=k, v=v, alibi_slopes=alibi_slopes)
    batch, seqlen_q, heads, _ = q.shape
    out = q.new_empty(q.shape)
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("flashattn::bwd")
def _bwd_fake(dout, q, k, v, out, lse, dlse, softmax_scale, causal, window_left, window_right,
              softcap, alibi_slopes, align_bottom_right, deterministic):
    _check_same_device(q, dout=dout, k=k, v=v, out=out, lse=lse, dlse=dlse,
                       alibi_slopes=alibi_slopes)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
     align_bottom_right, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes)
    ctx.mask_args = (softmax_scale, causal, window_left, window_right, softcap)
    ctx.align_bottom_right = align_bottom_right
    ctx.deterministic = deterministic


def _last_dim_contiguous(t):
    # Autograd may hand us expanded or transposed gradients; the kernels need a contiguous
    # last dimension. This is our own internal tensor, so making it so is not a user copy.
    return t if t.stride(-1) == 1 else t.contiguous()


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, alibi_slopes = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd(
        _last_dim_contiguous(dout), q, k, v, out, lse,
        None if dlse is None else dlse.contiguous(),
        *ctx.mask_args, alibi_slopes, ctx.align_bottom_right, ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd("flashattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)
