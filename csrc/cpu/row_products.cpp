#include "row_products.h"

#include <cstring>

#include "simd.h"

namespace flashattn::cpu {
namespace {

// kVecWidth elements from src, in fp32, straight into a register: no row is widened into a
// buffer first (perf: the store and reload of widened rows took a quarter of a bf16 decode).
FLASHATTN_ROW_STEP VecF load_widened(const float* src) { return load_vec(src); }

FLASHATTN_ROW_STEP VecF load_widened(const c10::BFloat16* src) {
  // bf16 is the top half of a float.
  using VecU16 = uint16_t __attribute__((vector_size(kVecWidth * sizeof(uint16_t))));
  using VecU32 = uint32_t __attribute__((vector_size(kVecWidth * sizeof(uint32_t))));
  VecU16 half_bits;
  std::memcpy(&half_bits, src, sizeof(half_bits));
  return reinterpret_cast<VecF>(__builtin_convertvector(half_bits, VecU32) << 16);
}

FLASHATTN_ROW_STEP VecF load_widened(const c10::Half* src) {
  VecF v;
  for (int i = 0; i < kVecWidth; ++i) v[i] = static_cast<float>(src[i]);
  return v;
}

// Rows of a cache are far apart (other heads lie between them), so the hardware prefetcher
// does not see a stream: each row is requested this many rows before it is read, or every
// row's first touch waits for memory (74% of the time of a bf16 decode in perf).
constexpr int kRowsAhead = 6;

template <typename In>
FLASHATTN_ROW_STEP void prefetch_row(const In* const* rows, int c, int cols, int dim) {
  if (c + kRowsAhead >= cols) return;
  const char* row = reinterpret_cast<const char*>(rows[c + kRowsAhead]);
  for (int64_t byte = 0; byte < int64_t(dim) * int64_t(sizeof(In)); byte += 64)
    __builtin_prefetch(row + byte);
}

// Keys taken together, and query rows with them: a 4 x 4 block of dot products loads 8
// vectors per 16 FMAs, where one row and one key load 2 per FMA.
constexpr int kBlock = 4;
// Values taken together: each output vector is loaded and stored once per 8 of them.
constexpr int kValueBlock = 8;

// sums[k] = 0 + v[k][0] + v[k][1] + ... + v[k][7], added in that order: the lanes of 8 dot
// products at once, through an 8 x 8 transpose, with the bits of a scalar loop over the lanes.
// Each sum depends on its own vector only, so a (row, key) gets the same bits however the
// rows and keys around it are grouped.
static_assert(kVecWidth == 8, "lane_sums transposes 8 x 8");
FLASHATTN_ROW_STEP VecF lane_sums(const VecF (&v)[8]) {
  VecF t[8], u[8];
  for (int k = 0; k < 8; k += 2) {  // pairs of rows, interleaved within 128-bit halves
    t[k] = __builtin_shufflevector(v[k], v[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(v[k], v[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4) {  // quads: lanes (l, l + 4) of 4 rows
    u[k] = __builtin_shufflevector(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 1] = __builtin_shufflevector(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[k + 2] = __builtin_shufflevector(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 3] = __builtin_shufflevector(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  VecF lane[8];  // lane[l][k] = v[k][l]
  for (int l = 0; l < 4; ++l) {
    lane[l] = __builtin_shufflevector(u[l], u[l + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    lane[l + 4] = __builtin_shufflevector(u[l], u[l + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  VecF sums = splat(0.f);
  for (int l = 0; l < 8; ++l) sums += lane[l];
  return sums;
}

// A tile of more than kBlock rows reads each key kBlock-row block after block: its keys are
// widened once into a buffer (fp32, in L1) instead of once per row block. Longer rows than this
// are widened per block (rare head dims).
constexpr int kWidenedRowMax = 256;

template <typename In>
FLASHATTN_ROW_STEP void dot_key_rows_impl(const float* q, int rows, int64_t q_ld,
                                          const In* const* keys, int cols, int dim,
                                          float* scores, int64_t ld) {
  const int whole = dim - dim % kVecWidth;
  alignas(64) float widened[kBlock][kWidenedRowMax];
  for (int c = 0; c < kRowsAhead && c < cols; ++c) prefetch_row(keys, c - kRowsAhead, cols, dim);
  for (int c0 = 0; c0 < cols; c0 += kBlock) {
    const int n_keys = cols - c0 < kBlock ? cols - c0 : kBlock;
    const In* key[kBlock];  // a missing key repeats the last one: computed and dropped
    for (int j = 0; j < kBlock; ++j) {
      prefetch_row(keys, c0 + j, cols, dim);
      key[j] = keys[c0 + (j < n_keys ? j : n_keys - 1)];
    }
    const bool widen_once = rows > kBlock && dim <= kWidenedRowMax;
    if (widen_once)
      for (int j = 0; j < kBlock; ++j)
        for (int d = 0; d < whole; d += kVecWidth) store_vec(widened[j] + d, load_widened(key[j] + d));
    for (int r0 = 0; r0 < rows; r0 += kBlock) {
      const int n_rows = rows - r0 < kBlock ? rows - r0 : kBlock;
      const float* q_rows[kBlock];
      for (int i = 0; i < kBlock; ++i) q_rows[i] = q + (r0 + (i < n_rows ? i : 0)) * q_ld;
      VecF acc[kBlock][kBlock];
#pragma GCC unroll 4
      for (int i = 0; i < kBlock; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < kBlock; ++j) acc[i][j] = splat(0.f);
      for (int d = 0; d < whole; d += kVecWidth) {
        VecF k[kBlock];
#pragma GCC unroll 4
        for (int j = 0; j < kBlock; ++j)
          k[j] = widen_once ? load_vec(widened[j] + d) : load_widened(key[j] + d);
#pragma GCC unroll 4
        for (int i = 0; i < kBlock; ++i) {
          const VecF qv = load_vec(q_rows[i] + d);
#pragma GCC unroll 4
          for (int j = 0; j < kBlock; ++j) acc[i][j] += qv * k[j];
        }
      }
      // Lanes, then the scalar tail of a head dim that is not a multiple of kVecWidth.
      alignas(64) float dots[kBlock][kBlock];
      for (int half = 0; half < 2; ++half) {
        const VecF pairs[8] = {acc[2 * half][0],     acc[2 * half][1],     acc[2 * half][2],
                               acc[2 * half][3],     acc[2 * half + 1][0], acc[2 * half + 1][1],
                               acc[2 * half + 1][2], acc[2 * half + 1][3]};
        VecF tails = splat(0.f);
        if (whole < dim)
          for (int e = 0; e < 8; ++e) {
            const int i = 2 * half + e / kBlock, j = e % kBlock;
            float tail = 0.f;
            for (int d = whole; d < dim; ++d)
              tail += q_rows[i][d] * static_cast<float>(key[j][d]);
            tails[e] = tail;
          }
        store_vec(&dots[2 * half][0], lane_sums(pairs) + tails);
      }
      for (int i = 0; i < n_rows; ++i)
        for (int j = 0; j < n_keys; ++j) scores[(r0 + i) * ld + c0 + j] = dots[i][j];
    }
  }
}

template <typename In>
FLASHATTN_ROW_STEP void add_value_rows_impl(const float* probs, int rows, int64_t ld,
                                            const In* const* values, int cols, int dim,
                                            float* out, int64_t out_ld) {
  for (int c = 0; c < kRowsAhead && c < cols; ++c)
    prefetch_row(values, c - kRowsAhead, cols, dim);
  const int whole = dim - dim % kVecWidth;
  for (int c0 = 0; c0 < cols; c0 += kValueBlock) {
    const int n_values = cols - c0 < kValueBlock ? cols - c0 : kValueBlock;
    const In* value[kValueBlock];
    for (int j = 0; j < kValueBlock; ++j) {
      prefetch_row(values, c0 + j, cols, dim);
      value[j] = values[c0 + (j < n_values ? j : 0)];
    }
    // The values in key order, one after another, as a single running sum per element. A
    // missing value adds 0 * 0, not 0 times a row (which might hold an inf).
    float p[kRowProductMaxRows][kValueBlock];
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < kValueBlock; ++j) p[r][j] = j < n_values ? probs[r * ld + c0 + j] : 0.f;
    for (int d = 0; d < whole; d += kVecWidth) {
      VecF v[kValueBlock];
#pragma GCC unroll 8
      for (int j = 0; j < kValueBlock; ++j)
        v[j] = j < n_values ? load_widened(value[j] + d) : splat(0.f);
      for (int r = 0; r < rows; ++r) {
        float* out_row = out + r * out_ld + d;
        VecF acc = load_vec(out_row);
#pragma GCC unroll 8
        for (int j = 0; j < kValueBlock; ++j) acc += splat(p[r][j]) * v[j];
        store_vec(out_row, acc);
      }
    }
    for (int d = whole; d < dim; ++d)
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < kValueBlock; ++j)
          out[r * out_ld + d] += p[r][j] * (j < n_values ? static_cast<float>(value[j][d]) : 0.f);
  }
}

}  // namespace

FLASHATTN_VECTOR_CLONES void dot_key_rows(const float* q, int rows, int64_t q_ld,
                                          const float* const* keys, int cols, int dim,
                                          float* scores, int64_t ld) {
  dot_key_rows_impl(q, rows, q_ld, keys, cols, dim, scores, ld);
}
FLASHATTN_VECTOR_CLONES void dot_key_rows(const float* q, int rows, int64_t q_ld,
                                          const c10::BFloat16* const* keys, int cols, int dim,
                                          float* scores, int64_t ld) {
  dot_key_rows_impl(q, rows, q_ld, keys, cols, dim, scores, ld);
}
FLASHATTN_VECTOR_CLONES void dot_key_rows(const float* q, int rows, int64_t q_ld,
                                          const c10::Half* const* keys, int cols, int dim,
                                          float* scores, int64_t ld) {
  dot_key_rows_impl(q, rows, q_ld, keys, cols, dim, scores, ld);
}

FLASHATTN_VECTOR_CLONES void add_value_rows(const float* probs, int rows, int64_t ld,
                                            const float* const* values, int cols, int dim,
                                            float* out, int64_t out_ld) {
  add_value_rows_impl(probs, rows, ld, values, cols, dim, out, out_ld);
}
FLASHATTN_VECTOR_CLONES void add_value_rows(const float* probs, int rows, int64_t ld,
                                            const c10::BFloat16* const* values, int cols,
                                            int dim, float* out, int64_t out_ld) {
  add_value_rows_impl(probs, rows, ld, values, cols, dim, out, out_ld);
}
FLASHATTN_VECTOR_CLONES void add_value_rows(const float* probs, int rows, int64_t ld,
                                            const c10::Half* const* values, int cols, int dim,
                                            float* out, int64_t out_ld) {
  add_value_rows_impl(probs, rows, ld, values, cols, dim, out, out_ld);
}

}  // namespace flashattn::cpu
