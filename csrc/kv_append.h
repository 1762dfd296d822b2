// flash_attn_with_kvcache's writes, per row, for every executor: a new key or value into its
// cache row, and the rotary embedding of keys and queries (params.h, KvAppendParams).
#pragma once
#include "kv_rows.h"
#include "params.h"

namespace flashattn {

// The cache row (key or value view) that new key t of sequence b goes to, or null when its
// position is outside the cache (the CPU rejects that on the host; devices skip it).
template <typename T>
FLASHATTN_HOST_DEVICE T* append_row(const TensorView& cache_view, const KvAppendParams& p, int b,
                                    int h, int t) {
  const int position = p.cache_seqlens[b] + t;
  if (position < 0 || position >= p.capacity) return nullptr;
  Sequence s;
  s.batch = s.kv_batch = b;
  if (p.cache.batch_index != nullptr)
    s.kv_batch = clamp_index(p.cache.batch_index[b], p.cache.cache_batch);
  return key_row<T>(cache_view, p.cache, s, h, position);
}

// out = x with its first rotary_dim elements rotated by the angles of `position` (clamped to
// the tables), computed in Compute and rounded once; the rest copied. out may be x. A row may
// be shared by `lanes` threads (a GPU warp): lane takes pairs and elements lane, lane + lanes,
// ..., so neighbouring lanes touch neighbouring elements; the CPU runs a row alone (0, 1).
template <typename In, typename Compute>
FLASHATTN_HOST_DEVICE void rotate_row(const In* x, In* out, const KvAppendParams& p,
                                      int position, int lane = 0, int lanes = 1) {
  position = clamp_index(position, p.rotary_rows);
  const In* cos = p.cos.row<const In>(0, 0, position);
  const In* sin = p.sin.row<const In>(0, 0, position);
  const int half = p.rotary_dim / 2;
  for (int i = lane; i < half; i += lanes) {
    // The pair (a, c) turns by angle i: GPT-J's neighbours or GPT-NeoX's halves.
    const int a = p.interleaved ? 2 * i : i, c = p.interleaved ? 2 * i + 1 : i + half;
    const Compute xa = static_cast<Compute>(x[a]), xc = static_cast<Compute>(x[c]);
    const Compute co = static_cast<Compute>(cos[i]), si = static_cast<Compute>(sin[i]);
    out[a] = static_cast<In>(xa * co - xc * si);
    out[c] = static_cast<In>(xc * co + xa * si);
  }
  if (out != x)
    for (int d = p.rotary_dim + lane; d < p.head_dim; d += lanes) out[d] = x[d];
}

// The position query `row` of sequence b is rotated at.
FLASHATTN_HOST_DEVICE int query_position(const KvAppendParams& p, int b, int row) {
  return p.cache_seqlens[b] + (p.q_position_per_token ? row : 0);
}

// The rows every executor runs, one call each: [new keys and values: batch x seqlen_new x
// heads_kv], then, with rotary embeddings, [queries: batch x seqlen_q x heads_q].
FLASHATTN_HOST_DEVICE int64_t append_rows(const KvAppendParams& p) {
  return static_cast<int64_t>(p.batch) * p.seqlen_new * p.heads_kv;
}
FLASHATTN_HOST_DEVICE int64_t query_rows(const KvAppendParams& p) {
  return p.rotary_dim > 0 ? static_cast<int64_t>(p.batch) * p.seqlen_q * p.heads_q : 0;
}

// Row i < append_rows(p) + query_rows(p): new key and value i into the cache (the key rotated),
// or query i - append_rows(p) rotated into q_rotated. T: the element as stored (it casts to and
// from Compute), Compute: the rotation's arithmetic. lane / lanes: this thread's share of the
// row's elements (rotate_row); every element is computed alike whoever computes it.
template <typename T, typename Compute>
FLASHATTN_HOST_DEVICE void append_or_rotate_row(const KvAppendParams& p, int64_t i, int lane = 0,
                                                int lanes = 1) {
  if (i < append_rows(p)) {
    const int h = static_cast<int>(i % p.heads_kv);
    const int t = static_cast<int>(i / p.heads_kv % p.seqlen_new);
    const int b = static_cast<int>(i / p.heads_kv / p.seqlen_new);
    T* key = append_row<T>(p.k_cache, p, b, h, t);
    if (key == nullptr) return;
    const T* new_key = p.k_new.row<const T>(b, h, t);
    if (p.rotary_dim > 0) {
      rotate_row<T, Compute>(new_key, key, p, p.cache_seqlens[b] + t, lane, lanes);
    } else {
      for (int d = lane; d < p.head_dim; d += lanes) key[d] = new_key[d];
    }
    // No v_new: v_cache is the start of k_cache's rows (kvcache_args.cpp), written just above.
    if (p.v_new.ptr == nullptr) return;
    T* value = append_row<T>(p.v_cache, p, b, h, t);
    const T* new_value = p.v_new.row<const T>(b, h, t);
    for (int d = lane; d < p.head_dim_v; d += lanes) value[d] = new_value[d];
    return;
  }
  const int64_t j = i - append_rows(p);
  const int h = static_cast<int>(j % p.heads_q);
  const int row = static_cast<int>(j / p.heads_q % p.seqlen_q);
  const int b = static_cast<int>(j / p.heads_q / p.seqlen_q);
  rotate_row<T, Compute>(p.q.row<const T>(b, h, row), p.q_rotated.row<T>(b, h, row), p,
                         query_position(p, b, row), lane, lanes);
}

}  // namespace flashattn
