// The row products on vdpbf16ps (row_products.h: dot_key_rows_bf16, add_value_rows_bf16).
// Compiled for AVX512-BF16 with __attribute__((target)) in an extension built for baseline
// x86-64; fwd.cpp calls them only where the 16-bit tile products run on vdpbf16ps, which
// panels16.h allows only after cpu_has_avx512_bf16() and a correctness check.
//
// Why: on a Zen 4 a decode step of 16 query rows per kv head (Sq = 4, a GQA group of 4) is
// compute-bound on fp32 FMAs (7.6 GB/s of cache read with 2 threads, a quarter of the copy
// bandwidth), and vdpbf16ps multiplies twice the pairs per instruction with nothing to widen.
//
// S = Q Kᵀ, two ways, by the query rows per kv head, both adding each (row, key)'s pairs in
// order from zero in one lane, as the tile GEMM does, so that a score has the same bits whichever
// way (and whichever kernel, tile or decode) computed it: a block of a sequence's rows (a ring
// rank's, block_offsets) gets the whole call's bits.
// - at least kLaneRowsMin (Sq = 4 of a GQA group of 4): the rows in the lanes of a vector, laid
//   out once per tile (lay_query_lanes_bf16), each key's pair of head-dim elements broadcast
//   from the cache row: 16 keys' dots for 16 rows with no horizontal sum, one 16 x 16 transpose
//   to store them. Dot blocks with horizontal sums took ~180 instructions a key and head at 16
//   rows, this takes ~75 (64 of them vdpbf16ps; a hot-cache loop of it: ~80 cycles a key and
//   head on a Zen 4).
// - fewer (Sq = 1): a rows-in-lanes vector would be mostly empty; the keys go in the lanes
//   instead, 16 keys' 32 head-dim elements transposed into one vector per pair, and each row's
//   pair broadcast against them.
// O += P V: the lanes are 16 head-dim columns and the pairs are two keys, so two value rows are
// interleaved (vpermt2w) into the pair order vdpbf16ps takes, and each row's pair of
// probabilities is broadcast from memory.
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>

#include "avx512_intrinsics.h"
#include "row_products.h"

namespace flashattn::cpu {
namespace {

std::atomic<int64_t> calls{0};
std::atomic<int64_t> lane_calls{0};  // the score products that took the rows in lanes

}  // namespace

int64_t bf16_row_products_run() { return calls.load(std::memory_order_relaxed); }
int64_t bf16_query_lanes_run() { return lane_calls.load(std::memory_order_relaxed); }

int64_t query_lanes_size(int heads, int dim) {
  return int64_t(heads) * ((dim + 1) / 2) * kQueryLanes;
}

void lay_query_lanes_bf16(const c10::BFloat16* q, int rows, int heads, int64_t ld, int dim,
                          int32_t* lanes) {
  TORCH_INTERNAL_ASSERT(rows <= kQueryLanes);
  const int pairs = (dim + 1) / 2;
  for (int g = 0; g < heads; ++g)
    for (int p = 0; p < pairs; ++p) {
      int32_t* lane = lanes + (int64_t(g) * pairs + p) * kQueryLanes;
      for (int r = 0; r < kQueryLanes; ++r) {
        lane[r] = 0;  // rows past the last: zero dots, never stored
        if (r < rows)
          std::memcpy(&lane[r], q + (int64_t(g) * rows + r) * ld + 2 * p, sizeof(int32_t));
      }
    }
}

#if FLASHATTN_HAVE_AVX512_KERNELS
namespace {

using row_stream::kKeysAhead;
using row_stream::prefetch_first_rows;
using BF16 = c10::BFloat16;
template <int kKeys>
using NextRows = row_stream::NextRows<kKeys, BF16>;
using avx512::lanes16;
using avx512::lanes32;

// Keys per step of the value product: 8 pairs, 16 zmm of interleaved values.
constexpr int kValuePairs = 8;

// 32 bf16 from p, lanes at or past n zero (never read).
FA_AVX512_BF16 FA_INLINE __m512i load_bf16(const BF16* p, int n) {
  return _mm512_maskz_loadu_epi16(lanes32(n), p);
}

// The rows-in-lanes score product: one accumulator a key.
constexpr int kLaneKeys = 16;
// Pairs of head-dim elements per step: 8 query vectors, which with the 16 accumulators leave
// room in the 32 zmm for the broadcasts (16 pairs spilled accumulators to the stack).
constexpr int kLanePairs = 8;

// The pair of bf16 at p as one 32-bit lane (unaligned: an odd head dim leaves rows at odd
// elements), in every lane.
FA_AVX512_BF16 FA_INLINE __m512i broadcast_pair(const BF16* p) {
  int32_t pair;
  std::memcpy(&pair, p, sizeof(pair));
  return _mm512_set1_epi32(pair);
}

// v[i][j] -> v[j][i] for 16 x 16 floats.
FA_AVX512_BF16 FA_INLINE void transpose16(__m512 (&v)[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks within each 128-bit lane
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {  // 4 x 4 blocks within each 128-bit lane
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    v[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    v[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    v[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    v[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // then the 4 x 4 grid of 128-bit lanes
    t[i] = _mm512_shuffle_f32x4(v[i], v[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(v[i], v[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(v[i + 8], v[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(v[i + 8], v[i + 12], 0xdd);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    v[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    v[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    v[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// The block of kLaneKeys keys from key c0, in head g, that both lane products take at a time:
// their rows (past the stream's end the last key repeats: its scores are computed, not stored),
// how many are real, and the rows kKeysAhead keys on that each step requests into L2.
struct LaneKeyBlock {
  int count;
  const BF16* row[kLaneKeys];
  NextRows<kLaneKeys> next;
  LaneKeyBlock(const RowStream<BF16>& keys, int c0, int g)
      : count(keys.count - c0 < kLaneKeys ? keys.count - c0 : kLaneKeys),
        next(keys, c0 + kKeysAhead, g) {
    for (int j = 0; j < kLaneKeys; ++j)
      row[j] = keys.rows[c0 + (j < count ? j : count - 1)] + g * keys.head_stride;
  }
};

// acc[j] += the kLanePairs pairs from pair p0 of the rows in lanes `lanes` times those of key j.
FA_AVX512_BF16 FA_INLINE void dot_lane_pairs(const int32_t* lanes,
                                             const BF16* const (&key)[kLaneKeys], int p0,
                                             __m512 (&acc)[kLaneKeys]) {
  __m512i q[kLanePairs];
#pragma GCC unroll 8
  for (int i = 0; i < kLanePairs; ++i) q[i] = _mm512_loadu_si512(lanes + (p0 + i) * kQueryLanes);
#pragma GCC unroll 16
  for (int j = 0; j < kLaneKeys; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < kLanePairs; ++i)
      acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)q[i],
                                (__m512bh)broadcast_pair(key[j] + 2 * (p0 + i)));
}

FA_AVX512_BF16 void dot_key_rows_in_lanes(const int32_t* lanes, int rows,
                                      const RowStream<BF16>& keys, int dim, float* scores,
                                      int64_t ld) {
  const int pairs = (dim + 1) / 2, whole_pairs = dim / 2;
  const int64_t row_bytes = int64_t(dim) * sizeof(BF16);
  prefetch_first_rows(keys, dim);
  for (int c0 = 0; c0 < keys.count; c0 += kLaneKeys) {
    for (int g = 0; g < keys.heads; ++g) {  // each block of keys through every head
      const LaneKeyBlock block(keys, c0, g);
      const int32_t* head_lanes = lanes + int64_t(g) * pairs * kQueryLanes;
      __m512 acc[kLaneKeys];
#pragma GCC unroll 16
      for (int j = 0; j < kLaneKeys; ++j) acc[j] = _mm512_setzero_ps();
      int p0 = 0;
      for (; p0 + kLanePairs <= whole_pairs; p0 += kLanePairs) {
        if (p0 % 16 == 0) block.next.request(4 * p0, 4 * p0 + 64);  // 16 pairs: 64 bytes
        dot_lane_pairs(head_lanes, block.row, p0, acc);
      }
      block.next.request((4 * p0 + 63) / 64 * 64, row_bytes);
      for (int p = p0; p < pairs; ++p) {
        const __m512i q = _mm512_loadu_si512(head_lanes + p * kQueryLanes);
        const bool last_odd = p == whole_pairs;  // the row ends half way through the pair
#pragma GCC unroll 16
        for (int j = 0; j < kLaneKeys; ++j) {
          const __m512i k = last_odd ? _mm512_set1_epi32(block.row[j][2 * p].x)
                                     : broadcast_pair(block.row[j] + 2 * p);
          acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)q, (__m512bh)k);
        }
      }
      transpose16(acc);  // acc[r]: row r's dots with the block's keys
      const __mmask16 stored = lanes16(block.count);
      float* head_scores = scores + int64_t(g) * rows * ld + c0;
      for (int r = 0; r < rows; ++r) _mm512_mask_storeu_ps(head_scores + r * ld, stored, acc[r]);
    }
  }
}

// The keys-in-lanes score product (fewer than kLaneRowsMin rows): kLaneKeys keys' rows, 32
// head-dim elements at a time, transposed so that vector p holds pair p of every key; each
// query row's pair p is broadcast against it. Like the rows-in-lanes product, each (row, key)
// is one lane that adds its pairs in order from zero, which is also how the tile GEMM
// (gemm_avx512_16bit.h) sums them: the three give a score the same bits.
// acc[r] += the first n_pairs (at most 16) pairs from pair p0 of row r (at q + r * q_ld) times
// key_pairs, for kRows rows: pair by pair through the rows, so that the rows' chains of
// vdpbf16ps interleave (one row's chain is serial, its pairs summed in order).
template <int kRows>
FA_AVX512_BF16 FA_INLINE void dot_rows_pairs(const BF16* q, int64_t q_ld, int p0, int n_pairs,
                                             const __m512 (&key_pairs)[16],
                                             __m512 (&acc)[kRows]) {
  if (n_pairs == 16) {
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p)
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r)
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)broadcast_pair(q + r * q_ld + 2 * (p0 + p)),
                                  (__m512bh)key_pairs[p]);
  } else {
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p)
      if (p < n_pairs)
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r)
          acc[r] = _mm512_dpbf16_ps(acc[r],
                                    (__m512bh)broadcast_pair(q + r * q_ld + 2 * (p0 + p)),
                                    (__m512bh)key_pairs[p]);
  }
}

// The keys-in-lanes score product for kRows query rows per kv head.
template <int kRows>
FA_AVX512_BF16 void dot_key_rows_keys_in_lanes(const BF16* q, int64_t q_ld,
                                               const RowStream<BF16>& keys, int dim,
                                               float* scores, int64_t ld) {
  const int pairs = (dim + 1) / 2;
  prefetch_first_rows(keys, dim);
  for (int c0 = 0; c0 < keys.count; c0 += kLaneKeys) {
    for (int g = 0; g < keys.heads; ++g) {  // each block of keys through every head
      const LaneKeyBlock block(keys, c0, g);
      const BF16* head_q = q + int64_t(g) * kRows * q_ld;
      __m512 acc[kRows];
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
      for (int p0 = 0; p0 < pairs; p0 += 16) {
        block.next.request(4 * p0, 4 * p0 + 64);  // 16 pairs: 64 bytes
        // Past an odd dim the load leaves a zero, the pair (last, 0) the other products take.
        __m512 key_pairs[16];
#pragma GCC unroll 16
        for (int j = 0; j < kLaneKeys; ++j)
          key_pairs[j] = _mm512_castsi512_ps(load_bf16(block.row[j] + 2 * p0, dim - 2 * p0));
        transpose16(key_pairs);  // key_pairs[p]: pair p0 + p of each key
        dot_rows_pairs<kRows>(head_q, q_ld, p0, pairs - p0 < 16 ? pairs - p0 : 16, key_pairs,
                              acc);
      }
      const __mmask16 stored = lanes16(block.count);
      float* head_scores = scores + int64_t(g) * kRows * ld + c0;
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r)
        _mm512_mask_storeu_ps(head_scores + r * ld, stored, acc[r]);
    }
  }
}

FA_AVX512_BF16 void dot_key_rows_keys_in_lanes(const BF16* q, int rows, int64_t q_ld,
                                               const RowStream<BF16>& keys, int dim,
                                               float* scores, int64_t ld) {
  static_assert(kLaneRowsMin - 1 == 8, "the cases below take 1 to 8 rows");
  switch (rows) {
    case 1: return dot_key_rows_keys_in_lanes<1>(q, q_ld, keys, dim, scores, ld);
    case 2: return dot_key_rows_keys_in_lanes<2>(q, q_ld, keys, dim, scores, ld);
    case 3: return dot_key_rows_keys_in_lanes<3>(q, q_ld, keys, dim, scores, ld);
    case 4: return dot_key_rows_keys_in_lanes<4>(q, q_ld, keys, dim, scores, ld);
    case 5: return dot_key_rows_keys_in_lanes<5>(q, q_ld, keys, dim, scores, ld);
    case 6: return dot_key_rows_keys_in_lanes<6>(q, q_ld, keys, dim, scores, ld);
    case 7: return dot_key_rows_keys_in_lanes<7>(q, q_ld, keys, dim, scores, ld);
    case 8: return dot_key_rows_keys_in_lanes<8>(q, q_ld, keys, dim, scores, ld);
  }
  TORCH_INTERNAL_ASSERT(false, "keys-in-lanes dots take 1 to 8 rows, not ", rows);
}

// Two value rows' 32 columns from d as the pairs vdpbf16ps multiplies: half h holds columns
// d + 16 h .. + 16, each lane (even's, odd's) element. A missing row is zeros.
FA_AVX512_BF16 FA_INLINE void interleave_pair(const BF16* even, const BF16* odd, int n,
                                          __m512i (&half)[2]) {
  const __m512i idx_low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                           40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                           32, 0);
  const __m512i idx_high = _mm512_add_epi16(idx_low, _mm512_set1_epi16(16));
  const __m512i a = even ? load_bf16(even, n) : _mm512_setzero_si512();
  const __m512i b = odd ? load_bf16(odd, n) : _mm512_setzero_si512();
  half[0] = _mm512_permutex2var_epi16(a, idx_low, b);
  half[1] = _mm512_permutex2var_epi16(a, idx_high, b);
}

// out[r][d ..] += the kValuePairs pairs of keys from c (value rows `value`, null when missing)
// for `rows` rows, 32 columns from d at a time.
FA_AVX512_BF16 FA_INLINE void add_value_pairs(const BF16* probs, int rows, int64_t ld,
                                          const BF16* const (&value)[2 * kValuePairs], int dim,
                                          const NextRows<2 * kValuePairs>& next, float* out,
                                          int64_t out_ld) {
  for (int d = 0; d < dim; d += 32) {
    next.request(2 * d, 2 * d + 64);  // 32 columns: 64 bytes
    __m512i pairs[kValuePairs][2];
#pragma GCC unroll 8
    for (int p = 0; p < kValuePairs; ++p)
      interleave_pair(value[2 * p] ? value[2 * p] + d : nullptr,
                      value[2 * p + 1] ? value[2 * p + 1] + d : nullptr, dim - d, pairs[p]);
    const __mmask16 low = lanes16(dim - d), high = lanes16(dim - d - 16);
    for (int r = 0; r < rows; ++r) {
      float* out_row = out + r * out_ld + d;
      __m512 acc_low = _mm512_maskz_loadu_ps(low, out_row);
      __m512 acc_high = _mm512_maskz_loadu_ps(high, out_row + 16);
      const int32_t* prob_pairs = reinterpret_cast<const int32_t*>(probs + r * ld);
#pragma GCC unroll 8
      for (int p = 0; p < kValuePairs; ++p) {
        const __m512i prob = _mm512_set1_epi32(prob_pairs[p]);
        acc_low = _mm512_dpbf16_ps(acc_low, (__m512bh)prob, (__m512bh)pairs[p][0]);
        acc_high = _mm512_dpbf16_ps(acc_high, (__m512bh)prob, (__m512bh)pairs[p][1]);
      }
      _mm512_mask_storeu_ps(out_row, low, acc_low);
      _mm512_mask_storeu_ps(out_row + 16, high, acc_high);
    }
  }
}

FA_AVX512_BF16 void add_value_rows_impl(const BF16* probs, int rows, int64_t ld,
                                    const RowStream<BF16>& values, int dim, float* out,
                                    int64_t out_ld) {
  constexpr int kKeys = 2 * kValuePairs;
  prefetch_first_rows(values, dim);
  for (int c0 = 0; c0 < values.count; c0 += kKeys) {
    const int n_values = values.count - c0 < kKeys ? values.count - c0 : kKeys;
    for (int g = 0; g < values.heads; ++g) {  // each step of values through every head
      const BF16* value[kKeys];
      for (int j = 0; j < kKeys; ++j)
        value[j] = j < n_values ? values.rows[c0 + j] + g * values.head_stride : nullptr;
      // Past the last value, whole pairs of zeros (probabilities included) are added: 0 * 0.
      add_value_pairs(probs + int64_t(g) * rows * ld + c0, rows, ld, value, dim,
                      NextRows<kKeys>(values, c0 + kKeysAhead, g),
                      out + int64_t(g) * rows * out_ld, out_ld);
    }
  }
}

}  // namespace

void dot_key_rows_bf16(const QueryTileBf16& q, const RowStream<BF16>& keys, int dim,
                       float* scores, int64_t ld) {
  calls.fetch_add(1, std::memory_order_relaxed);
  TORCH_INTERNAL_ASSERT(q.rows <= kQueryLanes && (q.lanes != nullptr) == takes_query_lanes(q.rows));
  if (q.lanes) {
    lane_calls.fetch_add(1, std::memory_order_relaxed);
    dot_key_rows_in_lanes(q.lanes, q.rows, keys, dim, scores, ld);
  } else {
    dot_key_rows_keys_in_lanes(q.q, q.rows, q.ld, keys, dim, scores, ld);
  }
}

void add_value_rows_bf16(const BF16* probs, int rows, int64_t ld, const RowStream<BF16>& values,
                         int dim, float* out, int64_t out_ld) {
  calls.fetch_add(1, std::memory_order_relaxed);
  add_value_rows_impl(probs, rows, ld, values, dim, out, out_ld);
}

#else  // no AVX512-BF16 code on this compiler or architecture: never chosen (panels16.h)

void dot_key_rows_bf16(const QueryTileBf16&, const RowStream<c10::BFloat16>&, int, float*,
                       int64_t) {
  TORCH_CHECK(false, "flashattn: vdpbf16ps row products are not built for this CPU");
}
void add_value_rows_bf16(const c10::BFloat16*, int, int64_t, const RowStream<c10::BFloat16>&,
                         int, float*, int64_t) {
  TORCH_CHECK(false, "flashattn: vdpbf16ps row products are not built for this CPU");
}

#endif

}  // namespace flashattn::cpu
