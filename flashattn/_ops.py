"""The one Python registration layer: fake (meta) kernels and autograd for torch.ops.flashattn.

The schemas themselves are defined once, in C++ (csrc/schema.h), and are the only place the
ops' arguments are listed: everything here reads them by name from the registered schema.
Registering fake kernels makes the ops traceable by torch.compile / torch.export; registering
autograd makes them trainable, including through the LSE output.
"""
import torch

from . import _C  # noqa: F401  the schemas must exist before we register against them

_FWD = torch.ops.flashattn.fwd.default
_BWD = torch.ops.flashattn.bwd.default
# The forward's argument names, in schema order; the backward takes them too, by name.
FWD_ARGUMENTS = tuple(a.name for a in _FWD._schema.arguments)
# The inputs the forward differentiates, and the bwd outputs that are their gradients (in
# bwd's order).
_GRADIENTS = {"q": "dq", "k": "dk", "v": "dv", "attn_mask": "dattn_mask"}


def bind_arguments(op, args, kwargs):
    """The arguments of a call of `op` as a dict by schema name, defaults filled in (the
    dispatcher drops arguments equal to their defaults before calling a Python kernel)."""
    bound = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        else:
            bound[arg.name] = arg.default_value
    return bound


def _check_same_device(q, tensors):
    # The real kernels check this too; the fake kernels must, or a mixed-device call would
    # dispatch to the fake (Meta) kernel and quietly "succeed".
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device != q.device:
            raise RuntimeError(f"flashattn: {name} must be on the same device as q ({q.device}), "
                               f"got {t.device}")


@torch.library.register_fake("flashattn::fwd")
def _fwd_fake(*args, **kwargs):
    a = bind_arguments(_FWD, args, kwargs)
    q = a["q"]
    _check_same_device(q, a)
    if a["cu_seqlens_q"] is not None:  # varlen: q [total_q, heads, D], lse [heads, total_q]
        total_q, heads, _ = q.shape
        lse_shape = (heads, total_q)
    else:
        batch, seqlen_q, heads, _ = q.shape
        lse_shape = (batch, heads, seqlen_q)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.register_fake("flashattn::bwd")
def _bwd_fake(*args, **kwargs):
    a = bind_arguments(_BWD, args, kwargs)
    _check_same_device(a["q"], a)
    dq, dk, dv = (a[name].new_empty(a[name].shape) for name in ("q", "k", "v"))
    mask = a["attn_mask"]
    return dq, dk, dv, mask.new_empty(mask.shape) if a["attn_mask_grad"] else None


@torch.library.register_fake("flashattn::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, *args, **kwargs):
    # The caches are written in place (declared Tensor(a!) in the schema); out and lse are new.
    _check_same_device(q, {"k_cache": k_cache, "v_cache": v_cache})
    batch, seqlen_q, heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


@torch.library.register_fake("flashattn::dropout_rng_state")
def _dropout_rng_state_fake(like):
    return like.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake("flashattn::dropout_keep_mask")
def _dropout_keep_mask_fake(rng_state, dropout_p, batch, heads, seqlen_q, seqlen_k):
    return rng_state.new_empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.bool)


def _fwd_setup_context(ctx, inputs, output):
    # inputs: every forward argument in schema order, defaults filled in. Tensors are saved
    # through save_for_backward (version-checked), the rest kept as they are.
    arguments = dict(zip(FWD_ARGUMENTS, inputs))
    ctx.tensor_names = [name for name, value in arguments.items()
                        if isinstance(value, torch.Tensor)]
    ctx.save_for_backward(*(arguments[name] for name in ctx.tensor_names), *output)
    ctx.other_arguments = {name: value for name, value in arguments.items()
                           if name not in ctx.tensor_names}


def _last_dim_contiguous(t):
    # Autograd may hand us expanded or transposed gradients; the kernels need a contiguous
    # last dimension. This is our own internal tensor, so making it so is not a user copy.
    return t if t.stride(-1) == 1 else t.contiguous()


def _fwd_backward(ctx, dout, dlse):
    *saved, out, lse = ctx.saved_tensors
    arguments = dict(zip(ctx.tensor_names, saved), **ctx.other_arguments)
    # needs_input_grad covers the arguments passed; defaults left out come last.
    mask_index = FWD_ARGUMENTS.index("attn_mask")
    mask_grad = mask_index < len(ctx.needs_input_grad) and ctx.needs_input_grad[mask_index]
    grads = torch.ops.flashattn.bwd(dout=_last_dim_contiguous(dout), out=out, lse=lse,
                                    dlse=dlse, attn_mask_grad=mask_grad, **arguments)
    by_input = dict(zip(_GRADIENTS, grads))
    return tuple(by_input.get(name) for name in FWD_ARGUMENTS)


torch.library.register_autograd("flashattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)


def _bwd_backward(ctx, *grads):
    # Without a formula of its own, autograd's fallback would let a second differentiation run
    # through bwd with a warning and return zeros (torch 2.14) or None under AOT (2.11): a
    # wrong answer. Differentiating bwd's outputs is an error instead; bwd itself, and first
    # gradients with create_graph=True, run as before.
    raise RuntimeError(
        "flashattn: double backward is not supported: the gradients of flash attention cannot "
        "be differentiated again (a gradient penalty, a Hessian-vector product). Use "
        "F.scaled_dot_product_attention's math backend for those terms.")


torch.library.register_autograd("flashattn::bwd", _bwd_backward)
