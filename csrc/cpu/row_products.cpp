#include "row_products.h"

#include <cstring>

#include "simd.h"

// Built for baseline x86-64 like the rest of the extension; the loops are compiled for
// AVX-512, AVX2+FMA and the baseline, and the loader picks one for the running CPU.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLASHATTN_VECTOR_CLONES
#endif
// Inlined into the cloned entry points, so compiled for each clone's target.
#define FLASHATTN_ROW_STEP __attribute__((always_inline)) inline

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

template <typename In>
FLASHATTN_ROW_STEP void dot_key_rows_impl(const float* q, int rows, int64_t q_ld,
                                          const In* const* keys, int cols, int dim,
                                          float* scores, int64_t ld) {
  alignas(64) float key[kRowPiece];
  for (int c = 0; c < kRowsAhead && c < cols; ++c) prefetch_row(keys, c - kRowsAhead, cols, dim);
  for (int c = 0; c < cols; ++c) {
    prefetch_row(keys, c, cols, dim);
    VecF lanes[kRowProductMaxRows];
    float tails[kRowProductMaxRows];
    for (int r = 0; r < rows; ++r) {
      lanes[r] = splat(0.f);
      tails[r] = 0.f;
    }
    for (int d0 = 0; d0 < dim; d0 += kRowPiece) {
      const int n = dim - d0 < kRowPiece ? dim - d0 : kRowPiece;
      widen(keys[c] + d0, key, n);
      const int whole = n - n % kVecWidth;
      for (int r = 0; r < rows; ++r) {
        const float* q_row = q + r * q_ld + d0;
        VecF acc = lanes[r];
        for (int d = 0; d < whole; d += kVecWidth) acc += load_vec(q_row + d) * load_vec(key + d);
        lanes[r] = acc;
        for (int d = whole; d < n; ++d) tails[r] += q_row[d] * key[d];
      }
    }
    for (int r = 0; r < rows; ++r) {
      float sum = 0.f;  // the lanes in a fixed order: the same result on every target
      for (int k = 0; k < kVecWidth; ++k) sum += lanes[r][k];
      scores[r * ld + c] = sum + tails[r];
    }
  }
}

template <typename In>
FLASHATTN_ROW_STEP void add_value_rows_impl(const float* probs, int rows, int64_t ld,
                                            const In* const* values, int cols, int dim,
                                            float* out, int64_t out_ld) {
  alignas(64) float value[kRowPiece];
  for (int c = 0; c < kRowsAhead && c < cols; ++c)
    prefetch_row(values, c - kRowsAhead, cols, dim);
  for (int c = 0; c < cols; ++c) {
    prefetch_row(values, c, cols, dim);
    for (int d0 = 0; d0 < dim; d0 += kRowPiece) {
      const int n = dim - d0 < kRowPiece ? dim - d0 : kRowPiece;
      widen(values[c] + d0, value, n);
      const int whole = n - n % kVecWidth;
      for (int r = 0; r < rows; ++r) {
        const float p = probs[r * ld + c];
        const VecF p_lanes = splat(p);
        float* out_row = out + r * out_ld + d0;
        for (int d = 0; d < whole; d += kVecWidth)
          store_vec(out_row + d, load_vec(out_row + d) + p_lanes * load_vec(value + d));
        for (int d = whole; d < n; ++d) out_row[d] += p * value[d];
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
