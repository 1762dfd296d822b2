"""The fake (meta) kernels of torch.ops.flashattn, which make the ops traceable by torch.compile
and torch.export.

The schemas themselves are defined once, in C++ (csrc/schema.h), and are the only place the
ops' arguments are listed: everything here reads them by name from the registered schema.
Autograd is registered in C++ (csrc/autograd.cpp), where it costs no Python per call.
"""
import torch

from . import _C  # noqa: F401  the schemas must exist before we register against them

_FWD = torch.ops.flashattn.fwd.default
_BWD = torch.ops.flashattn.bwd.default
_FWD_KVCACHE = torch.ops.flashattn.fwd_kvcache.default


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
    # out has v's head dim, which may differ from q's (MLA).
    out_shape = (*q.shape[:-1], a["v"].shape[-1])
    if a["cu_seqlens_q"] is not None:  # varlen: q [total_q, heads, D], lse [heads, total_q]
        total_q, heads, _ = q.shape
        lse_shape = (heads, total_q)
    else:
        batch, seqlen_q, heads, _ = q.shape
        lse_shape = (batch, heads, seqlen_q)
    # out_fp32 (internal, flashattn.distributed): out in float32 whatever q's 16 or 32 bits.
    # FP8 (float8_e4m3fn) inputs: out in bfloat16, FA3's (csrc/fp8_args.h).
    if q.dtype == torch.float8_e4m3fn:
        out_dtype = torch.bfloat16
    else:
        out_dtype = torch.float32 if a["out_fp32"] else q.dtype
    return (q.new_empty(out_shape, dtype=out_dtype),
            q.new_empty(lse_shape, dtype=torch.float32))


@torch.library.register_fake("flashattn::bwd")
def _bwd_fake(*args, **kwargs):
    a = bind_arguments(_BWD, args, kwargs)
    _check_same_device(a["q"], a)
    # grads_fp32 (internal, flashattn.distributed): dq, dk, dv in float32 whatever q's 16 or 32
    # bits.
    dtype = torch.float32 if a["grads_fp32"] else a["q"].dtype
    dq, dk, dv = (a[name].new_empty(a[name].shape, dtype=dtype) for name in ("q", "k", "v"))
    mask = a["attn_mask"]
    return dq, dk, dv, mask.new_empty(mask.shape) if a["attn_mask_grad"] else None


@torch.library.register_fake("flashattn::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, *args, **kwargs):
    # The caches are written in place (declared Tensor(a!) in the schema); out and lse are new.
    # Every tensor argument is checked: one on the meta device among CPU tensors sends the
    # call here, and a CPU q would otherwise get uninitialized outputs back.
    _check_same_device(q, bind_arguments(_FWD_KVCACHE, (q, k_cache, v_cache, *args), kwargs))
    batch, seqlen_q, heads, _ = q.shape
    out_shape = (batch, seqlen_q, heads, v_cache.shape[-1])  # v_cache's head dim (MLA)
    # FP8 (float8_e4m3fn) q and caches: out in bfloat16, as fwd's (csrc/fp8_args.h).
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    return (q.new_empty(out_shape, dtype=out_dtype),
            q.new_empty((batch, heads, seqlen_q), dtype=torch.float32))


@torch.library.register_fake("flashattn::dropout_rng_state")
def _dropout_rng_state_fake(like):
    return like.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake("flashattn::dropout_keep_mask")
def _dropout_keep_mask_fake(rng_state, dropout_p, batch, heads, seqlen_q, seqlen_k):
    return rng_state.new_empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.bool)
