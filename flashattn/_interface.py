"""The public entry points. All are thin: they translate arguments and pass strided views to
torch.ops.flashattn.fwd, never copying a tensor and never falling back to another kernel.

Arguments are accepted in every form FlashAttention-2 and F.scaled_dot_product_attention accept
them: window_size as a tuple, list or 2-element tensor of integers, scales as Python numbers,
numpy scalars or one-element tensors."""
import math
import numbers
import operator
import re

import torch

from ._attn_probs import dropped_probs

_SUPPORT = """
    Supported inputs:
      device  dtypes                          head_dim  v's head_dim (MLA)
      CPU     float32, float64, float16, bf16  any       any
      CUDA    float16, bf16, float32           <= 256    any <= 256
      CUDA    float16, bf16 (forward only)     <= 576    <= 512 (MLA's decode: 576 / 512)
      CUDA    float8_e4m3fn (forward only;     128       128 (H100/H200, FLASHATTN_CUDA_HOPPER=1;
              q_descale, k_descale, v_descale)           out bfloat16; see flash_attn_func)
    Any strides are accepted as long as the last (head_dim) dimension is contiguous. v may have
    a head dim of its own (headdim_v; DeepSeek's MLA: 192 and 128), which out, dout and dv
    then have; q and k share theirs.
"""


def _real(fn, name, value):
    """A float from a real number: a Python or numpy scalar, or a one-element tensor (FA2's
    pybind11 and torch's argument parser take the same)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{fn}: {name} must be a real number (a Python or numpy scalar, or a "
                    f"one-element tensor), got {value!r}")


def _optional_real(fn, name, value):
    return None if value is None else _real(fn, name, value)


def _window_pair(fn, window_size):
    """(left, right) as ints from any length-2 sequence of integers: tuple, list, numpy array
    or tensor (on any device) of an integer dtype, or of integer scalars."""
    if isinstance(window_size, torch.Tensor):
        valid = (window_size.numel() == 2 and window_size.dim() <= 1
                 and not window_size.is_floating_point() and not window_size.is_complex()
                 and window_size.dtype != torch.bool)
        pair = window_size.tolist() if valid else None
    else:
        try:
            pair = [operator.index(w) for w in window_size]
        except TypeError:  # not iterable, or an element that is not an integer
            pair = None
    if pair is None or len(pair) != 2:
        raise ValueError(
            f"{fn}: window_size must be a pair of ints (left, right), -1 meaning unbounded, "
            f"got {window_size!r}")
    return int(pair[0]), int(pair[1])


# fwd's defaults by argument name, from its schema (csrc/schema.h).
_FWD_DEFAULTS = {argument.name: argument.default_value
                 for argument in torch.ops.flashattn.fwd.default._schema.arguments
                 if argument.has_default_value()}
_FWD = torch.ops.flashattn.fwd.default
# Dynamo folds this to True while it traces; a plain function returning False otherwise
# (is_compiling, also true under a non-strict export, costs a few times more per call; a
# torch without the former takes it).
_is_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)
# OpOverload.__call__ is a Python frame (a check for a Python object dispatcher) around the C++
# binding `_op`, which handles __torch_function__ itself, so a small call is cheaper through
# `_op`. Dynamo does not trace the raw binding, so a traced call takes the OpOverload, as
# does an op given a Python dispatcher (torch may install one and swap `_op`: both are read
# per call), and so do torch releases without them.
_RAW_FWD = hasattr(_FWD, "_op") and hasattr(_FWD, "_pyobj_dispatcher")
# The front ends' default window_size (unbounded both ways), recognized by identity.
_UNBOUNDED = (-1, -1)


def _without_defaults(arguments):
    """The op's keyword arguments less those equal to its defaults, which the op fills in
    itself: each keyword passed costs ~0.4 µs of argument parsing, 4-5 µs for all of them, a
    third of a small forward."""
    return {name: value for name, value in arguments.items()
            if not (value is None if _FWD_DEFAULTS[name] is None
                    else not isinstance(value, torch.Tensor) and value == _FWD_DEFAULTS[name])}


def _window_or_default(fn, window_size):
    """(left, right) of window_size; the common (-1, -1) tuple without the general parsing."""
    if window_size.__class__ is tuple and len(window_size) == 2:
        left, right = window_size
        if left.__class__ is int and right.__class__ is int:
            return left, right
    return _window_pair(fn, window_size)


def _attention(fn, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
               alibi_slopes, deterministic, align_bottom_right, return_attn_probs=False,
               **op_arguments):
    """torch.ops.flashattn.fwd with FA2's argument conventions. Returns out, or with
    return_attn_probs (out, lse, S_dmask), S_dmask None without dropout (FA2's convention).
    op_arguments: more of the op's arguments by name (varlen, seqused, attn_mask).

    Small calls are dominated by this function and the op's argument parsing, so the op gets
    only the arguments that differ from its defaults (and the leading ones before them), and a
    Python float or int skips the general conversions (float, int and tuple checks by exact
    class)."""
    kwargs = _without_defaults(op_arguments) if op_arguments else {}
    if dropout_p.__class__ is not float or dropout_p != 0.0:
        dropout_p = _real(fn, "dropout_p", dropout_p)
        if dropout_p != 0.0:
            kwargs["dropout_p"] = dropout_p
    if softmax_scale is not None:
        softmax_scale = _real(fn, "softmax_scale", softmax_scale)
    causal = True if causal else False
    # The front ends' default is this very tuple: one identity test instead of the parsing.
    if window_size is _UNBOUNDED:
        left = right = -1
    else:
        left, right = _window_or_default(fn, window_size)
    if softcap.__class__ is not float or softcap != 0.0:
        softcap = _real(fn, "softcap", softcap)
    align_bottom_right = True if align_bottom_right else False
    deterministic = True if deterministic else False
    # The schema's leading arguments go positionally, up to the last one that differs from its
    # default: a keyword costs the op's parser twice what a position does (causal=True alone
    # added 0.75 µs to a 6 µs forward, positionally 0.3). The alignment moves only the
    # diagonal of causal, window and ALiBi: without them the op's default serves, and the
    # arguments before it stay unpassed (SDPA's plain call: 3, not 10).
    if deterministic:
        leading = 8
    elif not align_bottom_right and (causal or left != -1 or right != -1
                                     or alibi_slopes is not None):
        leading = 7
    elif alibi_slopes is not None:
        leading = 6
    elif softcap != 0.0:
        leading = 5
    elif right != -1:
        leading = 4
    elif left != -1:
        leading = 3
    elif causal:
        leading = 2
    else:
        leading = 1 if softmax_scale is not None else 0
    # A fresh [seed, offset] per call from the device's generator; autograd hands the same
    # one to the backward.
    rng_state = None
    if "dropout_p" in kwargs:
        rng_state = kwargs["rng_state"] = torch.ops.flashattn.dropout_rng_state(q)
    fwd = (_FWD if not _RAW_FWD or _is_compiling() or _FWD._pyobj_dispatcher is not None
           else _FWD._op)
    # The two commonest calls spelled out: building and slicing the whole tuple for a
    # star-call is a visible share of a one-row forward.
    if kwargs:
        out, lse = fwd(*(q, k, v, softmax_scale, causal, left, right, softcap, alibi_slopes,
                         align_bottom_right, deterministic)[:3 + leading], **kwargs)
    elif leading == 0:
        out, lse = fwd(q, k, v)
    elif leading == 2:
        out, lse = fwd(q, k, v, softmax_scale, causal)
    else:
        out, lse = fwd(*(q, k, v, softmax_scale, causal, left, right, softcap, alibi_slopes,
                         align_bottom_right, deterministic)[:3 + leading])
    if not return_attn_probs:
        return out
    probs = None
    if rng_state is not None:
        score_kwargs = dict(softmax_scale=softmax_scale, causal=causal,
                            window_size=(left, right), softcap=softcap, alibi_slopes=alibi_slopes,
                            align_bottom_right=align_bottom_right,
                            attn_mask=op_arguments.get("attn_mask"))
        probs = dropped_probs(q.detach(), k.detach(), rng_state, dropout_p, score_kwargs,
                              _sequences(op_arguments))
    return out, lse, probs


def _sequences(op_arguments):
    """(first query row, queries, first key row, keys) of each sequence of a varlen call, or
    None for a dense one. Reads cu_seqlens on the host: for return_attn_probs only."""
    if op_arguments.get("cu_seqlens_q") is None:
        return None
    cu_q, cu_k = op_arguments["cu_seqlens_q"].tolist(), op_arguments["cu_seqlens_k"].tolist()
    used_q, used_k = (op_arguments.get(name) for name in ("seqused_q", "seqused_k"))
    used_q = used_q.tolist() if used_q is not None else None
    used_k = used_k.tolist() if used_k is not None else None
    return [(cu_q[b], cu_q[b + 1] - cu_q[b] if used_q is None else used_q[b],
             cu_k[b], cu_k[b + 1] - cu_k[b] if used_k is None else used_k[b])
            for b in range(len(cu_q) - 1)]


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=_UNBOUNDED, softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, q_descale=None, k_descale=None, v_descale=None):
    """Exact softmax attention, FlashAttention-2's ``flash_attn_func`` signature.

    Args:
        q: (batch, seqlen_q, nheads, headdim)
        k: (batch, seqlen_k, nheads_k, headdim); nheads must be a multiple of nheads_k (GQA/MQA)
        v: (batch, seqlen_k, nheads_k, headdim_v); headdim_v may differ from headdim (MLA)
        dropout_p: drop each attention probability with this probability during the product
            with v, scaling the kept ones by 1 / (1 - dropout_p) (p = 1 gives 0). Exactly p:
            each decision compares a 32-bit draw, and is a pure function of the call's seed
            (from the device's default generator, so torch.manual_seed reproduces it) and of
            (batch, head, query, key): the same mask on every device and tile size. The
            backward drops the same entries.
        softmax_scale: scale of q·k, default 1 / sqrt(headdim).
        causal: causal mask, aligned to the bottom-right corner as in FlashAttention-2.
            Query i sees key j iff j <= i + seqlen_k - seqlen_q. For seqlen_q=2, seqlen_k=5
            (1 = kept, 0 = masked)::

                1 1 1 1 0
                1 1 1 1 1

            and for seqlen_q=5, seqlen_k=2 the first three rows see nothing (their output
            is 0, their LSE -inf)::

                0 0
                0 0
                0 0
                1 0
                1 1

        window_size: (left, right), a tuple, list or 2-element integer tensor. Query i sees
            keys in [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right];
            -1 = unbounded.
        softcap: if > 0, scores become softcap * tanh(scores / softcap) (after scaling).
        alibi_slopes: float32 (nheads,) or (batch, nheads), any strides; adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score.
        deterministic: make the backward pass bitwise reproducible (the CPU backward always is).
        return_attn_probs: also return the log-sum-exp of each row, and with dropout FA2's
            S_dmask.
        q_descale, k_descale, v_descale (keyword only, FlashAttention-3's FP8 forward): with
            q, k, v all float8_e4m3fn, float32 (batch, nheads_k), any strides, or None for 1.
            The stored values are scaled back by them per (batch, kv head): the scores are
            (q k^T) * q_descale * k_descale * softmax_scale and out is (P v) * v_descale.
            FP8 runs the sm_90a kernel only (an H100 or H200 with FLASHATTN_CUDA_HOPPER=1),
            at headdim 128, with no mask, causal or a sliding window, softcap or not, GQA
            (a decode's query heads packed per kv head, as for 16 bits), and no backward;
            out is bfloat16.
            Anything else with FP8 inputs is an error naming it.

    Returns:
        out: (batch, seqlen_q, nheads, headdim_v), dtype of q (bfloat16 for FP8 inputs). If return_attn_probs, the tuple
        (out, softmax_lse, S_dmask): softmax_lse is (batch, nheads, seqlen_q) float32 and
        differentiable; S_dmask is None without dropout, else (batch, nheads, seqlen_q,
        seqlen_k) float32, exp(logit - row max) negated where dropped, which FA2's test helpers
        decode. S_dmask is O(seqlen_q * seqlen_k): for tests and small shapes.
    """
    if q_descale is None and k_descale is None and v_descale is None:
        return _attention("flash_attn_func", q, k, v, dropout_p, softmax_scale, causal,
                          window_size, softcap, alibi_slopes, deterministic,
                          True,  # align_bottom_right
                          return_attn_probs)
    return _attention("flash_attn_func", q, k, v, dropout_p, softmax_scale, causal, window_size,
                      softcap, alibi_slopes, deterministic, True, return_attn_probs,
                      q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def _unpack(fn, name, packed, count, layout):
    """The `count` tensors stacked in dim 2 of `packed`, as views (no copy)."""
    if not isinstance(packed, torch.Tensor) or packed.dim() != 5 or packed.shape[2] != count:
        shape = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed)
        raise ValueError(f"{fn}: {name} must be a 5-D tensor {layout}, got {shape}")
    return packed.unbind(2)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=_UNBOUNDED, softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash_attn_func on q, k, v stacked in one tensor, FlashAttention-2's signature.

    Args:
        qkv: (batch, seqlen, 3, nheads, headdim); q, k and v are read from it in place.
        The other arguments and the result are flash_attn_func's. The gradient of qkv is
        assembled from those of q, k and v by autograd (one copy of the gradients).
    """
    q, k, v = _unpack("flash_attn_qkvpacked_func", "qkv", qkv, 3,
                      "(batch, seqlen, 3, nheads, headdim)")
    return _attention("flash_attn_qkvpacked_func", q, k, v, dropout_p, softmax_scale, causal,
                      window_size, softcap, alibi_slopes, deterministic, True,  # align_bottom_right
                      return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=_UNBOUNDED, softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash_attn_func with k and v stacked in one tensor, FlashAttention-2's signature.

    Args:
        q: (batch, seqlen_q, nheads, headdim)
        kv: (batch, seqlen_k, 2, nheads_k, headdim); k and v are read from it in place.
        The other arguments and the result are flash_attn_func's (GQA/MQA included).
    """
    k, v = _unpack("flash_attn_kvpacked_func", "kv", kv, 2,
                   "(batch, seqlen_k, 2, nheads_k, headdim)")
    return _attention("flash_attn_kvpacked_func", q, k, v, dropout_p, softmax_scale, causal,
                      window_size, softcap, alibi_slopes, deterministic, True,  # align_bottom_right
                      return_attn_probs)


def _length(fn, name, value):
    """max_seqlen: an int (a SymInt under torch.compile passes through), or an integer-like."""
    if isinstance(value, (int, torch.SymInt)):
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an int, got {value!r}") from None


def _check_inference_only(fn, block_table, dropout_p):
    """A paged KV cache is for inference. Inputs that require grad are fine, as in FA2: the
    forward runs, and a backward through it is the error (the bwd op takes no block_table)."""
    if block_table is None:
        return
    if _real(fn, "dropout_p", dropout_p) != 0.0:
        raise ValueError(f"{fn}: block_table (a paged KV cache) is for inference; dropout_p "
                         f"must be 0, got {dropout_p}")


_VARLEN_DOC = """
    A variable-length batch: B sequences of different lengths packed without padding, as FA2's
    varlen functions take them. Sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q
    and rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v. Causal, window and ALiBi are
    aligned bottom-right per sequence: query i of sequence b sees key j iff
    j <= i + Lk_b - Lq_b (and the window). Each sequence's result is the dense op's on that
    sequence alone (on the CPU bit for bit).

    Args (besides flash_attn_func's, which mean the same):
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,), starting at 0, non-decreasing, the last
            entry at most the number of tokens. On the CPU a malformed one is an error; on CUDA
            it is not checked (that would need a device sync), but no kernel ever reads or
            writes outside the tensors.
        max_seqlen_q, max_seqlen_k: ints bounding every sequence's length (upper bounds, as in
            FA2); on CUDA they size the grid.
        block_table: int32 (batch, max_blocks_per_seq), forward only: k and v are then the
            blocks of a paged KV cache, (num_blocks, page_size, nheads_k, headdim), any page
            size >= 1, and key j of sequence b is row j % page_size of block
            block_table[b, j // page_size]; cu_seqlens_k (or seqused_k) gives the lengths.
        seqused_q, seqused_k (keyword only, FA3's): int32 (batch,); only the first
            seqused_*[b] tokens of sequence b take part, so a preallocated buffer can be reused.
        q_descale, k_descale, v_descale (keyword only, FA3's FP8 forward): as in
            flash_attn_func, float32 (batch, nheads_k) with batch the number of sequences.

    Dropout and S_dmask as in flash_attn_func, S_dmask (batch, nheads, max seqlen_q,
    max seqlen_k) with row i, key j of sequence b at [b, :, i, j].

    Rows of q that belong to no sequence (past cu_seqlens_q[-1], or past seqused_q) get out 0,
    LSE -inf and zero gradients. A row that sees no key gets out 0 and LSE -inf, as in the
    dense op; FlashAttention-2's varlen kernels return +inf there.

    Returns:
        out: (total_q, nheads, headdim). If return_attn_probs, (out, softmax_lse, None) with
        softmax_lse (nheads, total_q) float32, differentiable.
"""


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=_UNBOUNDED,
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, seqused_q=None,
                           seqused_k=None, q_descale=None, k_descale=None, v_descale=None):
    """Exact softmax attention over a variable-length batch, FlashAttention-2's
    ``flash_attn_varlen_func`` signature (plus FA3's seqused_q / seqused_k).

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim), any strides with a
    contiguous last dim; nheads a multiple of nheads_k (GQA/MQA).
    """
    fn = "flash_attn_varlen_func"
    _check_inference_only(fn, block_table, dropout_p)
    return _attention(
        fn, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, align_bottom_right=True, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=_length(fn, "max_seqlen_q", max_seqlen_q),
        max_seqlen_k=_length(fn, "max_seqlen_k", max_seqlen_k), seqused_q=seqused_q,
        seqused_k=seqused_k, block_table=block_table, return_attn_probs=return_attn_probs,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def _unpack_varlen(fn, name, packed, count, layout):
    """The `count` tensors stacked in dim 1 of a varlen `packed`, as views (no copy)."""
    if not isinstance(packed, torch.Tensor) or packed.dim() != 4 or packed.shape[1] != count:
        shape = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed)
        raise ValueError(f"{fn}: {name} must be a 4-D tensor {layout}, got {shape}")
    return packed.unbind(1)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=_UNBOUNDED,
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func on q, k, v stacked in one tensor, FlashAttention-2's signature.

    qkv: (total, 3, nheads, headdim), read in place; cu_seqlens and max_seqlen serve queries
    and keys alike.
    """
    fn = "flash_attn_varlen_qkvpacked_func"
    q, k, v = _unpack_varlen(fn, "qkv", qkv, 3, "(total, 3, nheads, headdim)")
    max_seqlen = _length(fn, "max_seqlen", max_seqlen)
    return _attention(
        fn, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, align_bottom_right=True, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen, return_attn_probs=return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=_UNBOUNDED, softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """flash_attn_varlen_func with k and v stacked in one tensor, FlashAttention-2's signature.

    q: (total_q, nheads, headdim); kv: (total_k, 2, nheads_k, headdim), read in place.
    """
    fn = "flash_attn_varlen_kvpacked_func"
    k, v = _unpack_varlen(fn, "kv", kv, 2, "(total_k, 2, nheads_k, headdim)")
    return _attention(
        fn, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, align_bottom_right=True, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=_length(fn, "max_seqlen_q", max_seqlen_q),
        max_seqlen_k=_length(fn, "max_seqlen_k", max_seqlen_k),
        return_attn_probs=return_attn_probs)


def _check_sdpa_rank(name, t):
    if t.dim() != 4:
        raise ValueError(
            f"scaled_dot_product_attention: {name} must be 4-D (batch, heads, seqlen, head_dim), "
            f"got {t.dim()}-D with shape {tuple(t.shape)}")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """Exact softmax attention with ``torch.nn.functional.scaled_dot_product_attention``'s
    signature and semantics.

    Args:
        query: (batch, heads, seqlen_q, head_dim)
        key:   (batch, heads_kv, seqlen_k, head_dim)
        value: (batch, heads_kv, seqlen_k, head_dim_v); head_dim_v may differ from head_dim,
            as torch allows
        attn_mask: None, or a mask broadcastable to (batch, heads, seqlen_q, seqlen_k): bool
            (True = the key takes part) or float (added to the scores, -inf allowed), in
            query's dtype or float32. Read in place through its strides (a broadcast mask is
            never expanded in memory); a float mask that requires grad gets its gradient. Rows
            that see no key give 0 (and zero gradients), as torch >= 2.5 does.
        dropout_p: as in flash_attn_func: exact p, the same mask on every device for a seed.
        is_causal: causal mask aligned to the top-left corner, like F.sdpa
            (``torch.ones(L, S).tril()``): query i sees key j iff j <= i. For L=2, S=5::

                1 0 0 0 0
                1 1 0 0 0

            (flash_attn_func aligns to the bottom-right instead.)
        scale: scale of q·k, default 1 / sqrt(head_dim).
        enable_gqa: allow heads to be a multiple of heads_kv; otherwise they must be equal.

    Returns:
        (batch, heads, seqlen_q, head_dim_v) in query's dtype: a transposed view of a
        (batch, seqlen_q, heads, head_dim_v) buffer, as SDPA's flash backend returns.
    """
    fn = "scaled_dot_product_attention"
    if torch.float8_e4m3fn in (getattr(query, "dtype", None), getattr(key, "dtype", None),
                               getattr(value, "dtype", None)):
        # Its out would be bfloat16, not query's dtype, and it takes no descales.
        raise TypeError(f"{fn}: float8_e4m3fn (FP8) inputs are not supported here; "
                        f"flash_attn_func takes them with q_descale, k_descale, v_descale")
    if attn_mask is not None and is_causal:
        raise ValueError(f"{fn}: attn_mask and is_causal=True cannot be combined (as in "
                         f"F.scaled_dot_product_attention); put the causal mask into attn_mask")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        for name, t in (("query", query), ("key", key), ("value", value)):
            _check_sdpa_rank(name, t)
    if not enable_gqa and query.shape[1] != key.shape[1]:
        raise ValueError(
            f"{fn}: query has {query.shape[1]} heads but key has "
            f"{key.shape[1]}; pass enable_gqa=True for grouped-query attention")
    if scale is not None:  # validated here so that an error names SDPA's argument, not FA2's
        scale = _real(fn, "scale", scale)
        if not math.isfinite(scale):
            raise ValueError(f"{fn}: scale must be finite, got {scale}")
    # (B, H, S, D) -> (B, S, H, D) is a stride permutation, not a copy.
    try:
        mask = {} if attn_mask is None else {"attn_mask": attn_mask}
        out = _attention(fn, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                         dropout_p, scale, is_causal, _UNBOUNDED, 0.0, None, False,
                         align_bottom_right=False, **mask)
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        # The op names FA2's arguments (q, k, v, softmax_scale, causal) in (B, S, H, D); say it
        # in SDPA's terms. Only on the error path: a call that succeeds pays nothing.
        raise _sdpa_error(error, query, key, value) from None
    return out.transpose(1, 2)


# The op's argument names and what scaled_dot_product_attention calls them.
_SDPA_NAMES = {"q": "query", "k": "key", "v": "value", "softmax_scale": "scale",
               "causal": "is_causal"}
_OP_NAME = re.compile(r"(?<![A-Za-z0-9_'.])(" + "|".join(_SDPA_NAMES) + r")(?![A-Za-z0-9_(])")


def _sdpa_problem(query, key, value):
    """The first problem of query, key and value that the op would report, in SDPA's names and
    (batch, heads, seqlen, head_dim) shapes; None if none of these is found."""
    fn = "scaled_dot_product_attention"
    for name, t in (("key", key), ("value", value)):
        if t.device != query.device:
            return RuntimeError(f"{fn}: {name} must be on query's device ({query.device}), got "
                                f"{t.device}")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            return RuntimeError(f"{fn}: query, key and value must have the same dtype, got "
                                f"query {query.dtype}, {name} {t.dtype}")
    for name, t in (("key", key), ("value", value)):
        if t.shape[0] != query.shape[0]:
            return RuntimeError(f"{fn}: {name} must have query's batch size {query.shape[0]} "
                                f"(dim 0), got shape {tuple(t.shape)}")
    # value may have a head dim of its own (MLA), key may not.
    if key.shape[-1] != query.shape[-1]:
        return RuntimeError(f"{fn}: key must have query's head_dim {query.shape[-1]} "
                            f"(dim 3), got shape {tuple(key.shape)}")
    if key.shape[1] != value.shape[1] or key.shape[2] != value.shape[2]:
        return RuntimeError(f"{fn}: key and value must have the same heads and seqlen (dims 1 "
                            f"and 2), got shapes {tuple(key.shape)} and {tuple(value.shape)}")
    if key.shape[1] == 0 and query.shape[1] != 0 or (
            key.shape[1] and query.shape[1] % key.shape[1]):
        return RuntimeError(f"{fn}: query's heads ({query.shape[1]}) must be a multiple of "
                            f"key's and value's ({key.shape[1]}) with enable_gqa=True")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            return RuntimeError(f"{fn}: {name} must be contiguous in its last (head_dim) "
                                f"dimension, got strides {t.stride()}; call .contiguous() on it "
                                f"first")
    return None


def _sdpa_error(error, query, key, value):
    """The op's error for a scaled_dot_product_attention call, in SDPA's terms: a diagnosis of
    the tensors where one applies, else the message with the op's names replaced."""
    message = str(error)
    problem = _sdpa_problem(query, key, value)
    if problem is not None and not message.startswith("scaled_dot_product_attention"):
        return type(error)(str(problem)) if type(error) is not RuntimeError else problem
    if message.startswith("flashattn: "):
        message = "scaled_dot_product_attention: " + message[len("flashattn: "):]
    if not message.startswith("scaled_dot_product_attention"):
        return error
    translated = _OP_NAME.sub(lambda m: _SDPA_NAMES[m.group(1)], message)
    try:
        return type(error)(translated)
    except TypeError:  # an exception type that takes other arguments
        return error


for _fn in (flash_attn_varlen_func, flash_attn_varlen_qkvpacked_func,
            flash_attn_varlen_kvpacked_func):
    _fn.__doc__ += _VARLEN_DOC
for _fn in (flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func,
            flash_attn_varlen_func, flash_attn_varlen_qkvpacked_func,
            flash_attn_varlen_kvpacked_func, scaled_dot_product_attention):
    _fn.__doc__ += _SUPPORT
