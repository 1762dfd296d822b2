// Mask and score rules shared by every executor, so CPU and CUDA agree to the bit on which
// keys a query sees and how a raw score becomes a logit.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

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

// Part `part` of `parts` of the range [begin, end): contiguous, in order, as even as integers
// allow, possibly empty. How split-KV cuts a query block's key blocks, on every executor.
FLASHATTN_HOST_DEVICE void split_part(int& begin, int& end, int part, int parts) {
  const int64_t n = end - begin;
  const int first = begin;
  begin = first + static_cast<int>(n * part / parts);
  end = first + static_cast<int>(n * (part + 1) / parts);
}

// Split-KV's scratch on devices (params.h, num_splits): num_splits parts of o's elements (o is
// contiguous: rows x heads_q x head_dim_v, v's head dim), then num_splits parts of lse's
// (rows x heads_q), where the rows are batch x seqlen_q, or total_q for a varlen batch.
FLASHATTN_HOST_DEVICE int64_t output_rows(const AttnParams& p) {
  return p.cu_seqlens_q != nullptr ? p.total_q : static_cast<int64_t>(p.batch) * p.seqlen_q;
}
FLASHATTN_HOST_DEVICE int64_t split_out_elements(const AttnParams& p) {
  return output_rows(p) * p.heads_q * p.head_dim_v;
}
FLASHATTN_HOST_DEVICE int64_t split_lse_elements(const AttnParams& p) {
  return output_rows(p) * p.heads_q;
}

// Split s's part of output row (b, h, row), and of its LSE: o's and lse's element offsets
// from the part's base.
FLASHATTN_HOST_DEVICE float* split_out_row(const AttnParams& p, float* scratch, int s, int b,
                                           int h, int64_t row) {
  TensorView part = p.o;
  part.ptr = scratch + s * split_out_elements(p);
  return part.row<float>(b, h, row);
}
FLASHATTN_HOST_DEVICE float* split_lse_of(const AttnParams& p, float* scratch, int s, int b,
                                          int h, int64_t row) {
  TensorView part = p.lse;
  part.ptr = scratch + p.num_splits * split_out_elements(p) + s * split_lse_elements(p);
  return part.row<float>(b, h, row);
}

// Index of query row `row` of sequence `s`, query head `head`, among all heads_q x total_q
// query rows, head-major: where per-row scratch (the backward's D_i, its dQ accumulator)
// lives, so a varlen batch needs total_q rows of it, not batch x max_seqlen_q.
FLASHATTN_HOST_DEVICE int64_t query_row_index(const AttnParams& p, const Sequence& s, int head,
                                              int row) {
  return static_cast<int64_t>(head) * p.total_q + s.q_token0 + row;
}

// First key index row i may see (clipped at 0).
FLASHATTN_HOST_DEVICE int first_visible_key(const Sequence& s, int row) {
  if (s.window_left < 0) return 0;
  int first = row + s.diag_offset - s.window_left;
  return first > 0 ? first : 0;
}

// One past the last key index row i may see (clipped at seqlen_k). May be <= first_visible_key
// when the row sees nothing (e.g. causal top rows when Sq > Sk).
FLASHATTN_HOST_DEVICE int visible_key_end(const Sequence& s, int row) {
  if (s.window_right < 0) return s.seqlen_k;
  int end = row + s.diag_offset + s.window_right + 1;
  return end < s.seqlen_k ? end : s.seqlen_k;
}

FLASHATTN_HOST_DEVICE bool key_visible(const Sequence& s, int row, int key) {
  return key >= first_visible_key(s, row) && key < visible_key_end(s, row);
}

// The ALiBi slope of query head h in batch b; 0 when there is no ALiBi.
FLASHATTN_HOST_DEVICE float alibi_slope(const AttnParams& p, int b, int h) {
  return p.alibi.ptr != nullptr ? *p.alibi.row<const float>(b, h, 0) : 0.f;
}

// An IEEE half's bits as a float (host and device alike, without cuda_fp16.h on the host).
FLASHATTN_HOST_DEVICE float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu, word;
  if (exponent == 0x1fu) {
    word = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;  // +-0
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    word = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  memcpy(&value, &word, sizeof(value));
  return value;
}

// What attn_mask adds to the logit of (query row, key) of head (b, h), in the compute type T:
// 0 or -inf for a boolean mask, the value itself for a float one (float64 only with float64
// inputs, which only the CPU takes).
template <typename T = float>
FLASHATTN_HOST_DEVICE T mask_bias(const AttnMask& m, int b, int h, int64_t row, int64_t key) {
  const int64_t at =
      b * m.batch_stride + h * m.head_stride + row * m.row_stride + key * m.key_stride;
  switch (m.kind) {
    case MaskKind::kBool:
      return static_cast<const uint8_t*>(m.ptr)[at] != 0 ? T(0) : T(-INFINITY);
    case MaskKind::kFloat64:
      return static_cast<T>(static_cast<const double*>(m.ptr)[at]);
    case MaskKind::kFloat32:
      return static_cast<const float*>(m.ptr)[at];
    case MaskKind::kBFloat16: {
      const uint32_t word = static_cast<uint32_t>(static_cast<const uint16_t*>(m.ptr)[at]) << 16;
      float value;
      memcpy(&value, &word, sizeof(value));
      return value;
    }
    case MaskKind::kHalf:
      return half_bits_to_float(static_cast<const uint16_t*>(m.ptr)[at]);
  }
  return T(0);
}

// The class of tile [row_begin, row_end) x [key_begin, key_end) (both non-empty) of head (b, h)
// of attn_mask: kMaskHidden if every mask block it touches is, kMaskOpen if every one is (or
// there is no mask), else kMaskRead.
FLASHATTN_HOST_DEVICE uint8_t mask_tile(const AttnMask& m, int b, int h, int row_begin,
                                        int row_end, int key_begin, int key_end) {
  if (m.ptr == nullptr) return kMaskOpen;
  bool hidden = true, open = true;
  const uint8_t* head_blocks = m.blocks + b * m.block_batch_stride + h * m.block_head_stride;
  for (int rb = row_begin / kMaskBlock; rb <= (row_end - 1) / kMaskBlock; ++rb)
    for (int kb = key_begin / kMaskBlock; kb <= (key_end - 1) / kMaskBlock; ++kb) {
      const uint8_t block = head_blocks[rb * m.block_row_stride + kb * m.block_key_stride];
      hidden = hidden && block == kMaskHidden;
      open = open && block == kMaskOpen;
    }
  return hidden ? kMaskHidden : (open ? kMaskOpen : kMaskRead);
}

// -slope * |i + diag_offset - j|; slope 0 when there is no ALiBi.
FLASHATTN_HOST_DEVICE float alibi_bias(float slope, int diag_offset, int row, int key) {
  int dist = row + diag_offset - key;
  return -slope * static_cast<float>(dist < 0 ? -dist : dist);
}

}  // namespace flashattn
