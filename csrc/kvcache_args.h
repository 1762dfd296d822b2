// flash_attn_with_kvcache's arguments (schema.h, kFwdKvcacheSchema): the attention over the
// cache, and what is written into the cache first. Validated once, here, for every executor.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

#include "attn_args.h"
#include "params.h"

namespace flashattn {

struct KvcacheInputs {
  // q, k = k_cache, v = v_cache, the masks and the cache addressing; check_kvcache_append sets
  // seqused_k to cache_seqlens + S_new, and the op swaps in the rotated q.
  AttnInputs attn;
  std::optional<at::Tensor> k_new, v_new;  // [B, S_new, Hkv, D]
  std::optional<at::Tensor> rotary_cos, rotary_sin, cache_seqlens;
  bool rotary_interleaved = true;

  int64_t seqlen_new() const { return k_new ? k_new->size(1) : 0; }
  bool rotary() const { return rotary_cos.has_value(); }
};

// Validates the new keys and values, the rotary tables and cache_seqlens (with their values,
// where the executor reads lengths on the host), before anything is written, and sets
// in.attn.seqused_k. check_fwd(in.attn) still validates the attention itself.
void check_kvcache_append(KvcacheInputs& in, const ExecutorLimits& limits);

// The append's parameters; q_rotated receives q with the rotary embedding (unused without it).
KvAppendParams make_append_params(const KvcacheInputs& in, const at::Tensor& q_rotated);

}  // namespace flashattn
