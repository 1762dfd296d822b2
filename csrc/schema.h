// The op schemas, the one place their arguments are listed. csrc/flashattn.cpp registers them as
// torch.ops.flashattn.*; the test-only CPU-shim build registers the same strings under its own
// namespace, so the two executors cannot drift apart. Everything else reads the arguments by
// these names: the kernels' glue (op_glue.h), the fake kernels and autograd (flashattn/_ops.py)
// and the Python front ends (flashattn/_interface.py). A new argument is added here, with a
// default, and read where it is used.
#pragma once

namespace flashattn {

// The forward's arguments; the backward takes the same ones, by the same names, after its own.
// q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D], any strides with a contiguous last dim.
// softmax_scale: None is 1 / sqrt(D). window_* = -1 is unbounded; causal forces
// window_right = 0. align_bottom_right: the diagonal of causal/window/alibi sits at
// i + Sk - Sq (FA2) when true, at i (F.scaled_dot_product_attention's is_causal) when false,
// per sequence. attn_mask: F.sdpa's (dense batches), bool (true = take part) or float (added to
// the logit after softcap and ALiBi), broadcast to [B, Hq, Sq, Sk]. dropout_p > 0 drops each
// probability with that probability (dropout.h) from the [seed, offset] in rng_state (int64 [2],
// from dropout_rng_state), which the backward gets again to drop the same ones. deterministic is
// unused by the forward; it rides along so autograd can hand it to bwd.
// Variable-length batches (FA2's varlen): with cu_seqlens_q/_k (int32 [B + 1]) q is
// [total_q, Hq, D] and k/v [total_k, Hkv, D], sequence b being rows [cu[b], cu[b + 1]);
// max_seqlen_q/_k bound the sequences' lengths. seqused_q/_k (int32 [B], dense or varlen): only
// the first seqused[b] queries / keys of sequence b take part (FA3). Rows outside every
// sequence get out 0 and lse -inf, and zero gradients. block_table (int32 [B, max_blocks],
// forward only): k, v are a paged KV cache's blocks [num_blocks, page_size, Hkv, D], key j of
// sequence b being row j % page_size of block block_table[b][j / page_size]; dense or varlen q.
// block_offsets (int32 [B, 5], internal: flashattn.distributed's ring and Ulysses): the call
// is one block of a larger attention; per sequence b, (row_offset, key_offset, head_offset,
// diagonal, sequence) place its query rows, keys and query heads in sequence `sequence` of
// the whole attention, whose diagonal offset is `diagonal` (Sk - Sq of the whole sequence
// bottom-right, 0 top-left; it replaces align_bottom_right). Causal, window, ALiBi and dropout
// then act on the whole attention's positions (params.h, block_offsets).
// out_fp32 (internal: flashattn.distributed's ring): fwd returns out in float32 for float16,
// bfloat16 and float32 inputs, not rounded to 16 bits, so that partial outputs merge in float32
// (float64 inputs are refused). Forward only: bwd refuses it (its out and dout have q's dtype).
// q_descale, k_descale, v_descale (FA3's FP8 forward): float8_e4m3fn q, k, v (all three) run the
// sm_90a FP8 forward, whose out is bfloat16; the descales (fp32 [B, Hkv], any strides; None is
// 1) say what the stored values mean: the logits are (q k^T) * q_descale * k_descale * scale and
// out is (P v) * v_descale, per (sequence, kv head). Forward only (fp8_args.h): bwd carries them
// because it repeats these arguments, and refuses FP8 inputs and any descale.
#define FLASHATTN_ATTN_ARGUMENTS                                                              \
  "Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False, "             \
  "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, " \
  "bool align_bottom_right=True, bool deterministic=False, Tensor? cu_seqlens_q=None, "      \
  "Tensor? cu_seqlens_k=None, SymInt? max_seqlen_q=None, SymInt? max_seqlen_k=None, "        \
  "Tensor? seqused_q=None, Tensor? seqused_k=None, Tensor? attn_mask=None, "                \
  "float dropout_p=0.0, Tensor? rng_state=None, Tensor? block_table=None, "                \
  "Tensor? block_offsets=None, bool out_fp32=False, Tensor? q_descale=None, "             \
  "Tensor? k_descale=None, Tensor? v_descale=None"

// Returns out [B, Sq, Hq, D] and lse [B, Hq, Sq] (fp32, natural log, -inf for a row that sees
// no key); varlen: out [total_q, Hq, D] and lse [Hq, total_q].
inline constexpr const char* kFwdSchema =
    "fwd(" FLASHATTN_ATTN_ARGUMENTS ") -> (Tensor out, Tensor lse)";

// Gradients of fwd. dlse is the gradient of the lse output (None if it has none); it folds
// into D = rowsum(dout * out) - dlse so the LSE is differentiable. attn_mask_grad: also the
// gradient of a float attn_mask (dattn_mask, in its shape and dtype); None otherwise.
// grads_fp32 (internal: flashattn.distributed's ring): dq, dk, dv in float32 for float16,
// bfloat16 and float32 inputs, not rounded to 16 bits, so that a block's gradients add up in
// float32 across blocks (float64 inputs are refused). out and dout keep q's dtype.
inline constexpr const char* kBwdSchema =
    "bwd(Tensor dout, Tensor out, Tensor lse, Tensor? dlse, " FLASHATTN_ATTN_ARGUMENTS
    ", bool attn_mask_grad=False, bool grads_fp32=False) -> (Tensor dq, Tensor dk, Tensor dv, "
    "Tensor? dattn_mask)";

// FA2's flash_attn_with_kvcache (forward only): appends k, v [B, S_new, Hkv, D] into the
// caches in place at rows cache_seqlens[b] + t (k rotated when rotary_cos / rotary_sin
// [S_rotary, rotary_dim / 2] are given), rotates q, and attends to the first
// cache_seqlens[b] + S_new keys of each sequence (all of them without cache_seqlens), causal
// and window aligned bottom-right to that length. k_cache, v_cache: [B_cache, S_cache, Hkv, D],
// entry cache_batch_idx[b] for sequence b, keys before cache_leftpad[b] left out; or paged,
// [num_blocks, page_size, Hkv, D] with block_table. cache_seqlens, cache_batch_idx,
// cache_leftpad: int32 [B]. num_splits: split-KV parts (0: the executor chooses, 1: none).
// q_descale, k_descale, v_descale: fwd's (FA3's FP8 forward), for float8_e4m3fn q, k_cache,
// v_cache (all three, and k, v if given); out is then bfloat16, the descales per (sequence b
// of q, kv head) with cache_batch_idx too. An FP8 cache may be paged, indexed or left-padded,
// but takes no rotary, and with those three no softcap, ALiBi or attn_mask (kvcache_args.cpp).
// Returns out [B, Sq, Hq, D] and lse [B, Hq, Sq].
inline constexpr const char* kFwdKvcacheSchema =
    "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, "
    "Tensor? v=None, Tensor? rotary_cos=None, Tensor? rotary_sin=None, "
    "Tensor? cache_seqlens=None, Tensor? cache_batch_idx=None, Tensor? cache_leftpad=None, "
    "Tensor? block_table=None, float? softmax_scale=None, bool causal=False, "
    "int window_left=-1, int window_right=-1, float softcap=0.0, bool rotary_interleaved=True, "
    "Tensor? alibi_slopes=None, int num_splits=0, Tensor? q_descale=None, "
    "Tensor? k_descale=None, Tensor? v_descale=None) -> (Tensor out, Tensor lse)";

// A fresh [seed, offset] (int64 [2], on like's device) for one dropout call, drawn from the
// default generator of like's device, which it advances: torch.manual_seed reproduces it. On
// CUDA it follows the generator's philox state, so CUDA-graph replays draw anew.
inline constexpr const char* kDropoutRngStateSchema = "dropout_rng_state(Tensor like) -> Tensor";

// The keep decisions (bool [batch, heads, seqlen_q, seqlen_k], CPU) of a dropout call: what the
// kernels apply, for tests and FA2's return_attn_probs. O(batch·heads·seqlen_q·seqlen_k).
inline constexpr const char* kDropoutKeepMaskSchema =
    "dropout_keep_mask(Tensor rng_state, float dropout_p, int batch, int heads, int seqlen_q, "
    "int seqlen_k) -> Tensor";

}  // namespace flashattn
