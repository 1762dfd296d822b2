// Input validation and parameter-struct construction, written once for every executor.
//
// Every error names the argument and shows what was expected and what was given; messages
// speak of dimensions by meaning (batch, heads, head dim) so they read right from both the
// FA2-style (B, S, H, D) and the SDPA-style (B, H, S, D) front ends.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

#include "params.h"

namespace flashattn {

// The forward's arguments (schema.h's kAttnArguments), which the backward repeats by name.
struct AttnInputs {
  at::Tensor q, k, v;
  std::optional<double> softmax_scale;  // none: 1 / sqrt(head_dim)
  bool causal = false;
  int64_t window_left = -1;
  int64_t window_right = -1;
  double softcap = 0.0;
  std::optional<at::Tensor> alibi_slopes;
  std::optional<at::Tensor> attn_mask;  // F.sdpa's: bool or float, broadcast to [B, Hq, Sq, Sk]
  double dropout_p = 0.0;
  std::optional<at::Tensor> rng_state;  // int64 [2]: [seed, offset] (dropout.h)
  bool align_bottom_right = true;
  bool deterministic = false;
  // q, k [.., head_dim], v [.., head_dim_v]: head_dim_v may differ where the executor takes it
  // (ExecutorLimits), and out, dout and dv have it.
  // Variable-length batches: int32 [batch + 1] cumulative lengths; q, k, v are then
  // [total, heads, head_dim] and max_seqlen_* bound every sequence's length.
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k;
  std::optional<int64_t> max_seqlen_q, max_seqlen_k;
  // int32 [batch]: only the first seqused_*[b] queries / keys of sequence b take part.
  std::optional<at::Tensor> seqused_q, seqused_k;
  // A KV cache (forward only; kv_rows.h): k, v are the cache's pages [num_pages, page_size,
  // Hkv, D] read through block_table (int32 [batch, max_blocks]; dense or varlen q), or a dense
  // cache [B_cache, S_cache, Hkv, D] of which sequence b reads entry cache_batch_idx[b], from
  // row cache_leftpad[b] on (both int32 [batch]; dense q).
  std::optional<at::Tensor> block_table, cache_batch_idx, cache_leftpad;
  int64_t num_splits = 1;  // split-KV parts (params.h); 0 lets the executor choose
  // int32 [batch, 5]: the call is a block of a larger attention (params.h, block_offsets).
  std::optional<at::Tensor> block_offsets;
  bool out_fp32 = false;  // forward only: out in float32 for 16-bit inputs (params.h)
  // The FP8 forward's descales (fp32 [B, Hkv]; schema.h, fp8_args.h).
  std::optional<at::Tensor> q_descale, k_descale, v_descale;

  bool varlen() const { return cu_seqlens_q.has_value(); }
  bool paged() const { return block_table.has_value(); }
  bool kv_cache() const { return paged() || cache_batch_idx || cache_leftpad; }
};

// What the backward takes besides the forward's arguments.
struct BwdInputs {
  at::Tensor dout, out, lse;
  std::optional<at::Tensor> dlse;
  bool grads_fp32 = false;  // dq, dk, dv in float32 for 16-bit inputs (params.h)
};

// What one executor accepts; checked up front so an unsupported input is an error, never a
// silent slow path or a wrong answer.
struct ExecutorLimits {
  const char* name;                         // "CPU", "CUDA", ...
  std::vector<at::ScalarType> dtypes;       // accepted input dtypes
  int64_t max_head_dim;                     // inclusive; -1 = any
  // The executor reads cu_seqlens_* and seqused_* on the host (the CPU), so their values are
  // checked there, with errors naming them. Device executors never sync for them: their
  // kernels clamp every sequence to the tensors (mask.h, sequence_of).
  bool reads_lengths_on_host;
  // The executor has the FP8 forward (float8_e4m3fn q, k, v; fp8_args.h), where its device and
  // build allow (checked when it plans the call).
  bool fp8_forward = false;
};

// The KV cache addressing of the inputs (kv_rows.h), and the longest key sequence the cache
// holds (block table pages, or a dense cache entry's rows).
KvCache kv_cache_of(const AttnInputs& in);
int64_t kv_capacity(const AttnInputs& in);

// Validates the forward's inputs.
void check_fwd(const AttnInputs& in, const ExecutorLimits& limits);

// Validates the inputs and returns freshly allocated (out, lse): out [B, Sq, Hq, Dv] (v's head
// dim) contiguous in q's dtype (float32 with out_fp32), lse [B, Hq, Sq] fp32 (varlen: out
// [total_q, Hq, Dv], lse [Hq, total_q]).
std::tuple<at::Tensor, at::Tensor> check_and_alloc_fwd(const AttnInputs& in,
                                                       const ExecutorLimits& limits);

// The lse output of check_and_alloc_fwd alone: fp32 [B, Hq, Sq] (varlen [Hq, total_q]).
at::Tensor alloc_lse(const AttnInputs& in);

// Readies an output allocated elsewhere (in another op's layout, sdpa_impl.h): rows that the
// kernels never write (outside every sequence) become `value`; with FLASHATTN_POISON_OUTPUTS
// the rest is poisoned.
void prepare_output(at::Tensor& t, const AttnInputs& in, double value);

// mask_blocks: classify_mask_blocks(*in.attn_mask) (attn_mask.h), held by the caller until the
// kernels are done; undefined without a mask.
AttnParams make_fwd_params(const AttnInputs& in, const at::Tensor& out, const at::Tensor& lse,
                           const at::Tensor& mask_blocks);

// Validates the backward inputs against the forward ones.
void check_bwd(const AttnInputs& in, const BwdInputs& grads, const ExecutorLimits& limits);

// check_bwd, then freshly allocated (dq, dk, dv), each contiguous with the shape of its input,
// in its dtype (float32 with grads_fp32).
std::tuple<at::Tensor, at::Tensor, at::Tensor> check_and_alloc_bwd(const AttnInputs& in,
                                                                   const BwdInputs& grads,
                                                                   const ExecutorLimits& limits);

// dmask: a zeroed fp32 [B, Hq, Sq, Sk] for the kernels' dL/dlogit, or undefined.
AttnBwdParams make_bwd_params(const AttnInputs& in, const BwdInputs& grads, const at::Tensor& dq,
                              const at::Tensor& dk, const at::Tensor& dv,
                              const at::Tensor& mask_blocks, const at::Tensor& dmask);

// The buffer the backward kernels write dL/dlogit into, for the gradient of a float
// attn_mask: zeroed fp32 [B, Hq, Sq, Sk] (hidden tiles are never visited).
at::Tensor alloc_mask_grad(const AttnInputs& in);

// With FLASHATTN_POISON_OUTPUTS=1 in the environment (read once), freshly allocated outputs are
// filled with NaN before a kernel writes them, so tests see any element a kernel forgot.
void poison_if_debugging(at::Tensor& t);

}  // namespace flashattn
