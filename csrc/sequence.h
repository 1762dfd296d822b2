// One sequence of a batch as every executor sees it: where its rows and keys are, how long it is,
// its diagonal and window, and where it sits in a whole attention it is a block of. Its
// visibility rules are visibility.h.
#pragma once
#include <cstdint>

#include "params.h"

namespace flashattn {

// One sequence of the batch: where its rows are, how long it is, and which keys its queries
// see. Every kernel works on one sequence at a time; a dense batch is the case where all have
// the same lengths and the batch stride finds them.
struct Sequence {
  int batch = 0;         // its index in the batch
  int kv_batch = 0;      // the batch entry of the k / v views its keys are in (cache_batch_idx)
  int64_t q_row0 = 0;    // its first query row in the q / out / dout / dq / lse views
  int64_t k_row0 = 0;    // its first key row in the k / v / dk / dv views (0 when paged)
  int64_t q_token0 = 0;  // its first query's index among all total_q query rows (scratch)
  int seqlen_q = 0;      // queries (rows) and keys of the sequence that take part
  int seqlen_k = 0;
  // Row i sees key j iff (window_left < 0 || j >= i + diag_offset - window_left) &&
  // (window_right < 0 || j <= i + diag_offset + window_right) and j < seqlen_k.
  int diag_offset = 0;  // seqlen_k - seqlen_q aligned bottom-right (FA2), 0 top-left (SDPA)
  int window_left = -1;
  int window_right = -1;
  // Where the sequence's rows, keys and query heads sit in the whole attention when the call
  // is a block of it (params.h, block_offsets), and which of its sequences it is: dropout draws
  // at those positions. 0 and `batch` otherwise.
  int row_offset = 0;
  int key_offset = 0;
  int head_offset = 0;
  int whole_batch = 0;
};

// [begin, end) of sequence b in a cumulative-lengths array, clamped to [0, total] and to at
// most max_length rows: a malformed cu_seqlens can never lead a kernel out of its tensors
// (on CUDA nothing checks them on the host; the CPU checks them and never needs the clamp).
FLASHATTN_HOST_DEVICE void clamped_range(const int* cu_seqlens, int b, int64_t total,
                                         int max_length, int64_t& begin, int& length) {
  int64_t lo = cu_seqlens[b], hi = cu_seqlens[b + 1];
  lo = lo < 0 ? 0 : (lo > total ? total : lo);
  hi = hi < lo ? lo : (hi > total ? total : hi);
  begin = lo;
  length = static_cast<int>(hi - lo < max_length ? hi - lo : max_length);
}

// At most `used` (FA3's seqused) of `length` rows, when seqused is given.
FLASHATTN_HOST_DEVICE int used_length(const int* seqused, int b, int length) {
  if (seqused == nullptr) return length;
  const int used = seqused[b];
  return used < 0 ? 0 : (used < length ? used : length);
}

FLASHATTN_HOST_DEVICE int clamp_index(int i, int count) {
  return i < 0 ? 0 : (i >= count ? count - 1 : i);
}

FLASHATTN_HOST_DEVICE Sequence sequence_of(const AttnParams& p, int b) {
  Sequence s;
  s.batch = s.kv_batch = s.whole_batch = b;
  int length_q = p.seqlen_q, length_k = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    clamped_range(p.cu_seqlens_q, b, p.total_q, p.seqlen_q, s.q_row0, length_q);
    if (p.kv_cache.paged()) {
      // The keys are pages, not rows of k: cu_seqlens_k gives only the lengths.
      const int64_t length = int64_t(p.cu_seqlens_k[b + 1]) - p.cu_seqlens_k[b];
      length_k = static_cast<int>(length < 0 ? 0 : (length > p.seqlen_k ? p.seqlen_k : length));
    } else {
      clamped_range(p.cu_seqlens_k, b, p.total_k, p.seqlen_k, s.k_row0, length_k);
    }
    s.q_token0 = s.q_row0;
  } else {
    s.q_token0 = static_cast<int64_t>(b) * p.seqlen_q;
  }
  s.seqlen_q = used_length(p.seqused_q, b, length_q);
  s.seqlen_k = used_length(p.seqused_k, b, length_k);
  // A KV cache: the entry it names and the padding it skips, clamped like the lengths.
  if (p.kv_cache.batch_index != nullptr)
    s.kv_batch = clamp_index(p.kv_cache.batch_index[b], p.kv_cache.cache_batch);
  if (p.kv_cache.leftpad != nullptr) {
    const int pad = used_length(p.kv_cache.leftpad, b, s.seqlen_k);
    s.k_row0 += pad;
    s.seqlen_k -= pad;
  }
  if (p.block_offsets != nullptr) {
    // A block: local row i and key j are the whole attention's row_offset + i and
    // key_offset + j, so its diagonal i + diagonal - j = 0 is local i + diag_offset - j = 0.
    const int* at = p.block_offsets + 5 * static_cast<int64_t>(b);
    s.row_offset = at[0];
    s.key_offset = at[1];
    s.head_offset = at[2];
    s.diag_offset = at[3] + at[0] - at[1];
    s.whole_batch = at[4];
  } else {
    // Packed GQA heads (params.h): seqlen_q counts packed_heads rows per query.
    s.diag_offset = p.align_bottom_right ? s.seqlen_k - s.seqlen_q / p.packed_heads : 0;
  }
  s.window_left = p.window_left;
  s.window_right = p.window_right;
  return s;
}

// Index of query row `row` of sequence `s`, query head `head`, among all heads_q x total_q
// query rows, head-major: where per-row scratch (the backward's D_i, its dQ accumulator)
// lives, so a varlen batch needs total_q rows of it, not batch x max_seqlen_q.
FLASHATTN_HOST_DEVICE int64_t query_row_index(const AttnParams& p, const Sequence& s, int head,
                                              int row) {
  return static_cast<int64_t>(head) * p.total_q + s.q_token0 + row;
}

}  // namespace flashattn
