#include "row_products.h"

#include <cstring>

#include "simd.h"

namespace flashattn::cpu {
namespace {

// dst[0 .. n) = src[0 .. n) in fp32.
FLASHATTN_ROW_STEP void widen(const float* src, float* dst, int n) {
  std::memcpy(dst, src, sizeof(float) * n);
}

FLASHATTN_ROW_STEP void widen(const c10::BFloat16* src, float* dst, int n) {
  // bf16 is the top half of a float.
  using VecU32 = uint32_t __attribute__((vector_size(kVecWidth * sizeof(uint32_t))));
  using VecU16 = uint16_t __attribute__((vector_size(kVecWidth * sizeof(uint16_t))));
  int i = 0;
  for (; i + kVecWidth <= n; i += kVecWidth) {
    VecU16 half_bits;
    std::memcpy(&half_bits, src + i, sizeof(half_bits));
    const VecU32 bits = __builtin_convertvector(half_bits, VecU32) << 16;
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

FLASHATTN_ROW_STEP void widen(const c10::Half* src, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Room for one widened row: the CPU kernels take any head dim, so longer rows go in pieces.
constexpr int kRowPiece = 256;

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

// Keys (or values) taken together, and query rows with them: a 4 x 4 block of dot products
// loads 8 vectors per 16 FMAs, where one row and one key load 2 per FMA.
constexpr int kBlock = 4;

// One dot product's value from its lanes (in a fixed order: the same on every target) and the
// scalar tail: each (row, key) is summed alone, so the result depends on nothing else in the
// tile and a sequence gets the same bits however its rows are grouped.
FLASHATTN_ROW_STEP float lanes_plus_tail(VecF lanes, const float* q, const float* key, int whole,
                                         int dim) {
  float sum = 0.f;
  for (int k = 0; k < kVecWidth; ++k) sum += lanes[k];
  float tail = 0.f;
  for (int d = whole; d < dim; ++d) tail += q[d] * key[d];
  return sum + tail;
}

template <typename In>
FLASHATTN_ROW_STEP void dot_key_rows_impl(const float* q, int rows, int64_t q_ld,
                                          const In* const* keys, int cols, int dim,
                                          float* scores, int64_t ld) {
  alignas(64) float key[kBlock][kRowPiece];
  if (dim > kRowPiece) {  // rare head dims: one key and one row at a time, in pieces
    for (int c = 0; c < cols; ++c) {
      prefetch_row(keys, c, cols, dim);
      for (int r = 0; r < rows; ++r) scores[r * ld + c] = 0.f;
      for (int d0 = 0; d0 < dim; d0 += kRowPiece) {
        const int n = dim - d0 < kRowPiece ? dim - d0 : kRowPiece;
        widen(keys[c] + d0, key[0], n);
        const int whole = n - n % kVecWidth;
        for (int r = 0; r < rows; ++r) {
          const float* q_row = q + r * q_ld + d0;
          VecF acc = splat(0.f);
          for (int d = 0; d < whole; d += kVecWidth) acc += load_vec(q_row + d) * load_vec(key[0] + d);
          scores[r * ld + c] += lanes_plus_tail(acc, q_row, key[0], whole, n);
        }
      }
    }
    return;
  }
  const int whole = dim - dim % kVecWidth;
  for (int c = 0; c < kRowsAhead && c < cols; ++c) prefetch_row(keys, c - kRowsAhead, cols, dim);
  for (int c0 = 0; c0 < cols; c0 += kBlock) {
    const int n_keys = cols - c0 < kBlock ? cols - c0 : kBlock;
    for (int j = 0; j < kBlock; ++j) {
      prefetch_row(keys, c0 + j, cols, dim);
      if (j < n_keys)
        widen(keys[c0 + j], key[j], dim);
      else
        std::memset(key[j], 0, sizeof(float) * dim);  // computed and dropped
    }
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
        for (int j = 0; j < kBlock; ++j) k[j] = load_vec(key[j] + d);
#pragma GCC unroll 4
        for (int i = 0; i < kBlock; ++i) {
          const VecF qv = load_vec(q_rows[i] + d);
#pragma GCC unroll 4
          for (int j = 0; j < kBlock; ++j) acc[i][j] += qv * k[j];
        }
      }
      for (int i = 0; i < n_rows; ++i)
        for (int j = 0; j < n_keys; ++j)
          scores[(r0 + i) * ld + c0 + j] = lanes_plus_tail(acc[i][j], q_rows[i], key[j], whole, dim);
    }
  }
}

template <typename In>
FLASHATTN_ROW_STEP void add_value_rows_impl(const float* probs, int rows, int64_t ld,
                                            const In* const* values, int cols, int dim,
                                            float* out, int64_t out_ld) {
  alignas(64) float value[kBlock][kRowPiece];
  for (int c = 0; c < kRowsAhead && c < cols; ++c)
    prefetch_row(values, c - kRowsAhead, cols, dim);
  for (int c0 = 0; c0 < cols; c0 += kBlock) {
    const int n_values = cols - c0 < kBlock ? cols - c0 : kBlock;
    for (int j = 0; j < kBlock; ++j) prefetch_row(values, c0 + j, cols, dim);
    for (int d0 = 0; d0 < dim; d0 += kRowPiece) {
      const int n = dim - d0 < kRowPiece ? dim - d0 : kRowPiece;
      for (int j = 0; j < kBlock; ++j) {
        if (j < n_values)
          widen(values[c0 + j] + d0, value[j], n);
        else
          std::memset(value[j], 0, sizeof(float) * n);
      }
      const int whole = n - n % kVecWidth;
      for (int r = 0; r < rows; ++r) {
        // The values in key order, one after another, as a single running sum per element;
        // a missing key adds 0 * 0.
        float p[kBlock];
        for (int j = 0; j < kBlock; ++j) p[j] = j < n_values ? probs[r * ld + c0 + j] : 0.f;
        float* out_row = out + r * out_ld + d0;
        for (int d = 0; d < whole; d += kVecWidth) {
          VecF acc = load_vec(out_row + d);
#pragma GCC unroll 4
          for (int j = 0; j < kBlock; ++j) acc += splat(p[j]) * load_vec(value[j] + d);
          store_vec(out_row + d, acc);
        }
        for (int d = whole; d < n; ++d)
          for (int j = 0; j < kBlock; ++j) out_row[d] += p[j] * value[j][d];
      }
    }
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
