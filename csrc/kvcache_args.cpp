#include "kvcache_args.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "arg_checks.h"

namespace flashattn {
namespace {

// q [B, Sq, Hq, D]: query i of sequence b is rotated at position cache_seqlens[b] + i when
// causal or local (it sits at the end of the sequence), else every query at cache_seqlens[b]
// (FlashAttention-2's convention).
bool q_position_per_token(const AttnInputs& attn) {
  return attn.causal || attn.window_left >= 0 || attn.window_right >= 0;
}

void check_new_rows(const at::Tensor& t, const char* name, const KvcacheInputs& in) {
  const at::Tensor &q = in.attn.q, &cache = in.attn.k;
  TORCH_CHECK(t.dim() == 4 && t.size(0) == q.size(0) && t.size(2) == cache.size(2) &&
                  t.size(3) == q.size(3),
              "flashattn: ", name, " must have shape [batch, seqlen_new, heads_kv, head_dim] = [",
              q.size(0), ", seqlen_new, ", cache.size(2), ", ", q.size(3), "], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "flashattn: ", name, " must have q's dtype ",
              q.scalar_type(), ", got ", t.scalar_type());
  check_same_device(t, name, q);
  check_last_dim_contiguous(t, name);
}

void check_rotary_table(const at::Tensor& t, const char* name, const at::Tensor& like,
                        const at::Tensor& q) {
  TORCH_CHECK(t.dim() == 2 && t.sizes() == like.sizes(), "flashattn: ", name, " must be 2-D "
              "[seqlen_rotary, rotary_dim / 2] like rotary_cos ", like.sizes(), ", got ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "flashattn: ", name, " must have q's dtype ",
              q.scalar_type(), ", got ", t.scalar_type());
  check_same_device(t, name, q);
  check_last_dim_contiguous(t, name);
}

// The values, on the host: every new key fits in the cache, and every rotated position has a
// row of the rotary tables.
void check_append_values(const KvcacheInputs& in) {
  const int* seqlens = in.cache_seqlens->data_ptr<int>();
  const int64_t capacity = kv_capacity(in.attn), seqlen_new = in.seqlen_new();
  const int64_t rotary_rows = in.rotary() ? in.rotary_cos->size(0) : 0;
  const int64_t q_span = q_position_per_token(in.attn) ? in.attn.q.size(1) : 1;
  for (int64_t b = 0; b < in.attn.q.size(0); ++b) {
    const int64_t length = seqlens[b];
    TORCH_CHECK(length >= 0 && length + seqlen_new <= capacity, "flashattn: cache_seqlens[", b,
                "] + seqlen_new = ", length, " + ", seqlen_new, " keys do not fit in the ",
                in.attn.paged() ? "block_table's pages" : "cache", ", which hold ", capacity,
                in.attn.paged() ? " (max_blocks_per_sequence * page_size)" : "");
    if (!in.rotary()) continue;
    const int64_t last = length + std::max<int64_t>(seqlen_new, q_span) - 1;
    TORCH_CHECK(last < rotary_rows, "flashattn: rotary_cos / rotary_sin have ", rotary_rows,
                " rows (positions), but sequence ", b, " needs position ", last,
                " (cache_seqlens[", b, "] = ", length, ")");
  }
}

}  // namespace

void check_kvcache_append(KvcacheInputs& in, const ExecutorLimits& limits) {
  const at::Tensor& q = in.attn.q;
  TORCH_CHECK(q.dim() == 4, "flashattn: q must be a 4-D tensor [batch, seqlen_q, heads, "
              "head_dim], got ", q.dim(), "-D with shape ", q.sizes());
  TORCH_CHECK(in.attn.k.dim() == 4, "flashattn: k_cache must be a 4-D tensor [batch_cache, "
              "seqlen_cache, heads_kv, head_dim] (or [num_blocks, page_size, heads_kv, "
              "head_dim] with block_table), got shape ", in.attn.k.sizes());
  for (auto [t, name] : {std::pair{&in.attn.k, "k_cache"}, std::pair{&in.attn.v, "v_cache"}})
    TORCH_CHECK(t->dim() == 4 && t->size(3) == q.size(3), "flashattn: ", name, " must have q's "
                "head_dim ", q.size(3), " in its last dimension, got shape ", t->sizes());
  TORCH_CHECK(in.k_new.has_value() == in.v_new.has_value(), "flashattn: pass both k and v "
              "(the keys and values to append) or neither");
  if (in.k_new) {
    check_new_rows(*in.k_new, "k", in);
    check_new_rows(*in.v_new, "v", in);
    TORCH_CHECK(in.v_new->size(1) == in.k_new->size(1), "flashattn: k and v must have the same "
                "seqlen_new, got ", in.k_new->size(1), " and ", in.v_new->size(1));
    TORCH_CHECK(in.cache_seqlens.has_value(), "flashattn: appending k and v needs "
                "cache_seqlens, where each sequence's new keys go");
  }
  TORCH_CHECK(in.rotary_cos.has_value() == in.rotary_sin.has_value(), "flashattn: pass both "
              "rotary_cos and rotary_sin or neither");
  if (in.rotary()) {
    TORCH_CHECK(in.k_new.has_value(), "flashattn: rotary_cos / rotary_sin rotate the new keys "
                "k as they are appended, and q; pass k and v too");
    check_rotary_table(*in.rotary_cos, "rotary_cos", *in.rotary_cos, q);
    check_rotary_table(*in.rotary_sin, "rotary_sin", *in.rotary_cos, q);
    const int64_t rotary_dim = 2 * in.rotary_cos->size(1);
    TORCH_CHECK(rotary_dim > 0 && rotary_dim <= q.size(3), "flashattn: rotary_dim = 2 * "
                "rotary_cos.shape[1] = ", rotary_dim, " must be in [2, head_dim = ", q.size(3),
                "]");
  }
  if (in.cache_seqlens) {
    check_lengths_tensor(*in.cache_seqlens, "cache_seqlens", q.size(0), "batch", q);
    if (limits.reads_lengths_on_host) check_append_values(in);
    in.attn.seqused_k =
        in.seqlen_new() > 0 ? at::add(*in.cache_seqlens, in.seqlen_new()) : *in.cache_seqlens;
  }
}

KvAppendParams make_append_params(const KvcacheInputs& in, const at::Tensor& q_rotated) {
  KvAppendParams p;
  const AttnInputs& attn = in.attn;
  if (in.k_new) {
    p.k_new = rows_view(*in.k_new, false);
    p.v_new = rows_view(*in.v_new, false);
    p.cache_seqlens = in.cache_seqlens->data_ptr<int>();
  }
  p.k_cache = rows_view(attn.k, false);
  p.v_cache = rows_view(attn.v, false);
  p.cache = kv_cache_of(attn);
  p.cache.leftpad = nullptr;  // new keys go to absolute positions
  p.capacity = static_cast<int>(kv_capacity(attn));
  p.batch = static_cast<int>(attn.q.size(0));
  p.seqlen_new = static_cast<int>(in.seqlen_new());
  p.heads_kv = static_cast<int>(attn.k.size(2));
  p.head_dim = static_cast<int>(attn.q.size(3));
  if (in.rotary()) {
    const at::Tensor &cos = *in.rotary_cos, &sin = *in.rotary_sin;
    p.cos = {const_cast<void*>(cos.data_ptr()), 0, cos.stride(0), 0};
    p.sin = {const_cast<void*>(sin.data_ptr()), 0, sin.stride(0), 0};
    p.rotary_dim = static_cast<int>(2 * cos.size(1));
    p.rotary_rows = static_cast<int>(cos.size(0));
    p.interleaved = in.rotary_interleaved;
    p.q = rows_view(attn.q, false);
    p.q_rotated = rows_view(q_rotated, false);
    p.seqlen_q = static_cast<int>(attn.q.size(1));
    p.heads_q = static_cast<int>(attn.q.size(2));
    p.q_position_per_token = q_position_per_token(attn);
  }
  return p;
}

}  // namespace flashattn
