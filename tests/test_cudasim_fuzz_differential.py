"""Differential fuzzing on the shim (issue 34): the CUDA kernels' own source (torch.ops.flashattn_sim,
tests/sim_ext) through the same Hypothesis draws and checks as test_fuzz_differential.py --
dense (flash_attn_func, the packed functions, scaled_dot_product_attention), varlen (plain,
packed, paged, seqused) and KV-cache (dense and paged, cache_batch_idx, cache_leftpad, rotary,
num_splits) calls, forward and backward, against the float64 reference by the tolerance rule
(2x PyTorch's error in the same dtype, 3x for gradients).

Drawn from the CUDA support table: float16, bfloat16 (tensor-core kernels) and float32 (SIMT
kernels), head dims up to 256 (whole 16-byte chunks and not), causal (both alignments), window,
softcap, ALiBi, dropout (checked against the kernels' keep mask), GQA, attn_mask, deterministic,
strided views. Sizes are the shim's: every CUDA thread is a fiber, so lengths stop at 129 and
batches at 3 (the tile edges 64 / 128 are still crossed).

SimAPI below stands in for the public functions: the same signatures, over the sim ops, with a
torch.autograd.Function whose backward is the sim's bwd (so gradients of packed tensors and SDPA
views flow as through the public functions). The dropout seed is drawn exactly as the public
functions draw it, so keep_mask_of_next_call predicts it.

CI runs a small derandomized budget; a campaign (fresh random examples, per test):

    FLASHATTN_FUZZ_EXAMPLES=1000 TORCH_EXTENSIONS_DIR=... \\
        python -m pytest tests/test_cudasim_fuzz_differential.py -p no:cacheprovider
"""
import os

import pytest
import torch
from hypothesis import given

import test_fuzz_differential as fuzz
from executors import make_executor

SIM_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
SIM_LENGTHS = [0, 1, 2, 17, 63, 64, 65, 129]
SIM_HEAD_DIMS = [1, 7, 8, 32, 40, 64, 100, 128, 256]

# Examples per test in CI (the shim is slow); FLASHATTN_FUZZ_EXAMPLES overrides, as on the CPU.
CI = {"dense": int(os.environ.get("FLASHATTN_SIM_FUZZ_DENSE", 25)),
      "varlen": int(os.environ.get("FLASHATTN_SIM_FUZZ_VARLEN", 15)),
      "kvcache": int(os.environ.get("FLASHATTN_SIM_FUZZ_KVCACHE", 25))}


@pytest.fixture(scope="module")
def sim():
    return make_executor("sim")


def _rng_state(q, dropout_p):
    """The public functions' dropout seed: a fresh one from the default generator."""
    return torch.ops.flashattn.dropout_rng_state(q) if dropout_p else None


class _SimAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ops, arguments, q, k, v):
        out, lse = ops.fwd(q, k, v, **arguments)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ops, ctx.arguments = ops, arguments
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv, _ = ctx.ops.bwd(dout.contiguous(), out, lse, dlse, q, k, v, **ctx.arguments)
        return None, None, dq, dk, dv


class SimAPI:
    """flashattn's public functions (those the fuzzer calls) over torch.ops.flashattn_sim."""

    def __init__(self, ops):
        self.ops = ops

    def _attention(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                   return_attn_probs=False, align_bottom_right=True, **op_arguments):
        arguments = dict(softmax_scale=softmax_scale, causal=bool(causal),
                         window_left=int(window_size[0]), window_right=int(window_size[1]),
                         softcap=float(softcap), alibi_slopes=alibi_slopes,
                         align_bottom_right=align_bottom_right, deterministic=bool(deterministic),
                         dropout_p=float(dropout_p), rng_state=_rng_state(q, dropout_p),
                         **op_arguments)
        out, lse = _SimAttention.apply(self.ops, arguments, q, k, v)
        return (out, lse, None) if return_attn_probs else out

    def flash_attn_func(self, q, k, v, **kwargs):
        return self._attention(q, k, v, **kwargs)

    def flash_attn_kvpacked_func(self, q, kv, **kwargs):
        return self._attention(q, *kv.unbind(2), **kwargs)

    def flash_attn_qkvpacked_func(self, qkv, **kwargs):
        return self._attention(*qkv.unbind(2), **kwargs)

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        out = self._attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                              dropout_p=dropout_p, softmax_scale=scale, causal=is_causal,
                              align_bottom_right=False, attn_mask=attn_mask)
        return out.transpose(1, 2)

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, seqused_q=None, seqused_k=None, block_table=None,
                               **kwargs):
        return self._attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                               seqused_q=seqused_q, seqused_k=seqused_k, block_table=block_table,
                               **kwargs)

    def flash_attn_varlen_kvpacked_func(self, q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                        max_seqlen_k, **kwargs):
        return self.flash_attn_varlen_func(q, *kv.unbind(1), cu_seqlens_q, cu_seqlens_k,
                                           max_seqlen_q, max_seqlen_k, **kwargs)

    def flash_attn_varlen_qkvpacked_func(self, qkv, cu_seqlens, max_seqlen, **kwargs):
        return self.flash_attn_varlen_func(*qkv.unbind(1), cu_seqlens, cu_seqlens, max_seqlen,
                                           max_seqlen, **kwargs)

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                                rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                                cache_leftpad=None, block_table=None, softmax_scale=None,
                                causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                                return_softmax_lse=False):
        out, lse = self.ops.fwd_kvcache(
            q, k_cache, v_cache, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
            cache_leftpad=cache_leftpad, block_table=block_table, softmax_scale=softmax_scale,
            causal=bool(causal), window_left=int(window_size[0]),
            window_right=int(window_size[1]), softcap=float(softcap),
            rotary_interleaved=bool(rotary_interleaved), alibi_slopes=alibi_slopes,
            num_splits=num_splits)
        return (out, lse) if return_softmax_lse else out


@fuzz.budget(CI["dense"])
@given(call=fuzz.dense_calls(SIM_DTYPES, SIM_LENGTHS, SIM_HEAD_DIMS))
def test_sim_dense_functions_match_the_float64_reference(sim, call):
    fuzz.check_dense(call, SimAPI(sim.ops))


@fuzz.budget(CI["varlen"])
@given(call=fuzz.varlen_calls(SIM_DTYPES, SIM_LENGTHS, SIM_HEAD_DIMS))
def test_sim_varlen_functions_match_the_float64_reference(sim, call):
    fuzz.check_varlen(call, SimAPI(sim.ops))


@fuzz.budget(CI["kvcache"])
@given(call=fuzz.kvcache_calls(SIM_DTYPES, SIM_LENGTHS, SIM_HEAD_DIMS, seqlens_q=(1, 1, 2, 5, 65)))
def test_sim_kvcache_matches_the_float64_reference_and_appends_exactly(sim, call):
    fuzz.check_kvcache(call, SimAPI(sim.ops))
