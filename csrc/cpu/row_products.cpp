#include "row_products.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "row_sums.h"
#include "simd.h"

namespace flashattn::cpu {
namespace {

using row_stream::kKeysAhead;
using row_stream::NextRows;
using row_stream::prefetch_first_rows;

// The products run on 8- or 16-lane vectors (row_lanes()). On an AVX-512 CPU they take 16
// lanes at a time, one zmm: a bf16 decode step was issue-bound at 8 lanes (perf: one core read
// the cache at 6.4 GB/s, where a plain read loop pulls 13; 9.4 at 16 lanes). Other CPUs take 8
// (16 would need 32 ymm accumulators, twice what AVX2 has). The 16-lane code is compiled once,
// for x86-64-v4 (the FLASHATTN_AVX512 functions below), not in every clone.

// lanes<V> elements from src, in fp32, straight into a register: no row is widened into a
// buffer first (perf: the store and reload of widened rows took a quarter of a bf16 decode).
template <typename V>
FLASHATTN_ROW_STEP V load_widened(const float* src) { return load<V>(src); }

template <typename V>
FLASHATTN_ROW_STEP V load_widened(const c10::BFloat16* src);
template <typename V>
FLASHATTN_ROW_STEP V load_widened(const c10::Half* src);

template <>
FLASHATTN_ROW_STEP VecF load_widened<VecF>(const c10::BFloat16* src) {
  // bf16 is the top half of a float.
  using VecU16 = uint16_t __attribute__((vector_size(8 * sizeof(uint16_t))));
  using VecU32 = uint32_t __attribute__((vector_size(8 * sizeof(uint32_t))));
  VecU16 half_bits;
  std::memcpy(&half_bits, src, sizeof(half_bits));
  return reinterpret_cast<VecF>(__builtin_convertvector(half_bits, VecU32) << 16);
}

template <>
FLASHATTN_ROW_STEP VecF load_widened<VecF>(const c10::Half* src) {
  VecF v;
  for (int i = 0; i < 8; ++i) v[i] = static_cast<float>(src[i]);
  return v;
}

// The 16-lane widenings are one instruction each, written out: GCC 12 lowers the same
// __builtin_convertvector as two 8-lane halves and an insert (6 instructions, objdump), and
// the intrinsics cannot be inlined into these target-neutral templates. Only FLASHATTN_AVX512
// functions instantiate them, and only x86-64-v4 CPUs run those (row_lanes()).
template <>
FLASHATTN_ROW_STEP VecF16 load_widened<VecF16>(const c10::BFloat16* src) {
  using VecU32x16 = uint32_t __attribute__((vector_size(16 * sizeof(uint32_t))));
  VecU32x16 bits;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm("vpmovzxwd {%1, %0|%0, %1}" : "=v"(bits) : "m"(*reinterpret_cast<const char(*)[32]>(src)));
#else  // never run (row_lanes() is 8 off x86), but compiled
  for (int i = 0; i < 16; ++i) bits[i] = reinterpret_cast<const uint16_t*>(src)[i];
#endif
  return reinterpret_cast<VecF16>(bits << 16);  // bf16 is the top half of a float
}

template <>
FLASHATTN_ROW_STEP VecF16 load_widened<VecF16>(const c10::Half* src) {
  VecF16 v;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm("vcvtph2ps {%1, %0|%0, %1}" : "=v"(v) : "m"(*reinterpret_cast<const char(*)[32]>(src)));
#else
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(src[i]);
#endif
  return v;
}

// Keys taken together, and query rows with them: a 4 x 4 block of dot products loads 8
// vectors per 16 FMAs, where one row and one key load 2 per FMA.
constexpr int kBlock = kDotBlock;
// Values taken together: each output vector is loaded and stored once per 8 of them.
constexpr int kValueBlock = 8;

// Adds an 8-lane vector to the first 8 lanes of a wider one (the last 8-element piece of a
// head dim that is not a multiple of 16).
FLASHATTN_ROW_STEP VecF16 add_to_first_8(VecF16 wide, VecF v) {
  return wide + __builtin_shufflevector(v, VecF{}, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                        14, 15);
}

// A tile of more than kBlock rows reads each key kBlock-row block after block: its keys are
// widened once into a buffer (fp32, in L1) instead of once per row block. Longer rows than this
// are widened per block (rare head dims).
constexpr int kWidenedRowMax = 256;

// acc[i][j] += q_rows[i][d, d + lanes) · key[j][d, d + lanes) for d in [begin, end), a
// vector at a time; requesting the same elements of the next rows, unless `next` is null.
template <typename V, typename In>
FLASHATTN_ROW_STEP void accumulate_dots(const float* const (&q_rows)[kBlock],
                                        const In* const (&key)[kBlock],
                                        const float (*widened)[kWidenedRowMax], int begin,
                                        int end, const NextRows<kBlock, In>* next,
                                        V (&acc)[kBlock][kBlock]) {
  for (int d = begin; d < end; d += lanes<V>) {
    if (next) next->request(int64_t(d) * sizeof(In), int64_t(d + lanes<V>) * sizeof(In));
    V k[kBlock];
#pragma GCC unroll 4
    for (int j = 0; j < kBlock; ++j)
      k[j] = widened ? load<V>(widened[j] + d) : load_widened<V>(key[j] + d);
#pragma GCC unroll 4
    for (int i = 0; i < kBlock; ++i) {
      const V qv = load<V>(q_rows[i] + d);
#pragma GCC unroll 4
      for (int j = 0; j < kBlock; ++j) acc[i][j] += qv * k[j];
    }
  }
}

// The dots of `rows` query rows (q_ld apart) with kBlock keys (n_keys of them real: a missing
// key repeats the last one, computed and dropped) into scores[r * ld + j]: lanes<Wide> lanes as
// far as the head dim allows them, then 8, then the scalar tail. The sums' order is fixed by
// the head dim and Wide alone. Requests `next` as it goes (row_stream.h).
template <typename Wide, typename In>
FLASHATTN_ROW_STEP void dot_key_block(const float* q, int rows, int64_t q_ld,
                                      const In* const (&key)[kBlock], int n_keys, int dim,
                                      const NextRows<kBlock, In>& next,
                                      float (*widened)[kWidenedRowMax], float* scores,
                                      int64_t ld) {
  const int whole_wide = dim - dim % lanes<Wide>;
  const int whole = dim - dim % kVecWidth;
  const bool widen_once = rows > kBlock && dim <= kWidenedRowMax;
  if (widen_once)
    for (int j = 0; j < kBlock; ++j) {
      for (int d = 0; d < whole_wide; d += lanes<Wide>) {
        if (j == 0)
          next.request(int64_t(d) * sizeof(In), int64_t(d + lanes<Wide>) * sizeof(In));
        store(widened[j] + d, load_widened<Wide>(key[j] + d));
      }
      for (int d = whole_wide; d < whole; d += kVecWidth)
        store(widened[j] + d, load_widened<VecF>(key[j] + d));
    }
  for (int r0 = 0; r0 < rows; r0 += kBlock) {
    const int n_rows = rows - r0 < kBlock ? rows - r0 : kBlock;
    const float* q_rows[kBlock];
    for (int i = 0; i < kBlock; ++i) q_rows[i] = q + (r0 + (i < n_rows ? i : 0)) * q_ld;
    Wide acc[kBlock][kBlock];
#pragma GCC unroll 4
    for (int i = 0; i < kBlock; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < kBlock; ++j) acc[i][j] = Wide{};
    accumulate_dots(q_rows, key, widen_once ? widened : nullptr, 0, whole_wide,
                    widen_once || r0 > 0 ? nullptr : &next, acc);
    if constexpr (lanes<Wide> == 16)
      if (whole > whole_wide) {  // an 8-element piece before the scalar tail
        VecF piece[kBlock][kBlock] = {};
        accumulate_dots(q_rows, key, widen_once ? widened : nullptr, whole_wide, whole,
                        static_cast<const NextRows<kBlock, In>*>(nullptr), piece);
        for (int i = 0; i < kBlock; ++i)
          for (int j = 0; j < kBlock; ++j) acc[i][j] = add_to_first_8(acc[i][j], piece[i][j]);
      }
    // Lanes, then the scalar tail of a head dim that is not a multiple of kVecWidth.
    alignas(64) float dots[kBlock * kBlock];
    block_dots(acc, dots);
    if (whole < dim)
      for (int e = 0; e < kBlock * kBlock; ++e) {
        const int i = e / kBlock, j = e % kBlock;
        float tail = 0.f;
        for (int d = whole; d < dim; ++d) tail += q_rows[i][d] * static_cast<float>(key[j][d]);
        dots[e] += tail;
      }
    if (r0 == 0) next.request(int64_t(whole_wide) * sizeof(In), int64_t(dim) * sizeof(In));
    if (n_rows == kBlock && n_keys == kBlock)
      for (int i = 0; i < kBlock; ++i)
        std::memcpy(scores + (r0 + i) * ld, dots + kBlock * i, sizeof(float) * kBlock);
    else
      for (int i = 0; i < n_rows; ++i)
        for (int j = 0; j < n_keys; ++j) scores[(r0 + i) * ld + j] = dots[kBlock * i + j];
  }
}

// kBlock keys at a time, each through every head (row_stream.h: RowStream).
template <typename Wide, typename In>
FLASHATTN_ROW_STEP void dot_key_rows_impl(const float* q, int rows, int64_t q_ld,
                                          const RowStream<In>& keys, int dim, float* scores,
                                          int64_t ld) {
  alignas(64) float widened[kBlock][kWidenedRowMax];
  prefetch_first_rows(keys, dim);
  for (int c0 = 0; c0 < keys.count; c0 += kBlock) {
    const int n_keys = keys.count - c0 < kBlock ? keys.count - c0 : kBlock;
    for (int g = 0; g < keys.heads; ++g) {
      const In* key[kBlock];
      for (int j = 0; j < kBlock; ++j)
        key[j] = keys.rows[c0 + (j < n_keys ? j : n_keys - 1)] + g * keys.head_stride;
      dot_key_block<Wide>(q + int64_t(g) * rows * q_ld, rows, q_ld, key, n_keys, dim,
                          NextRows<kBlock, In>(keys, c0 + kKeysAhead, g), widened,
                          scores + int64_t(g) * rows * ld + c0, ld);
    }
  }
}

// out[r][d, d + lanes) += sum_j p[r][j] * value[j][d, d + lanes) for d in [begin, end), the
// values in key order, one after another, as a single running sum per element; requesting the
// same elements of the next rows.
template <typename V, typename In>
FLASHATTN_ROW_STEP void accumulate_values(const float (*p)[kValueBlock], int rows,
                                          const In* const (&value)[kValueBlock], int n_values,
                                          int begin, int end,
                                          const NextRows<kValueBlock, In>& next, float* out,
                                          int64_t out_ld) {
  for (int d = begin; d < end; d += lanes<V>) {
    next.request(int64_t(d) * sizeof(In), int64_t(d + lanes<V>) * sizeof(In));
    V v[kValueBlock];
#pragma GCC unroll 8
    for (int j = 0; j < kValueBlock; ++j)
      v[j] = j < n_values ? load_widened<V>(value[j] + d) : V{};
    for (int r = 0; r < rows; ++r) {
      float* out_row = out + r * out_ld + d;
      V acc = load<V>(out_row);
      // A scalar operand: one broadcast (an embedded one in the 16-lane FMA).
#pragma GCC unroll 8
      for (int j = 0; j < kValueBlock; ++j) acc += v[j] * p[r][j];
      store(out_row, acc);
    }
  }
}

// Each output element is one running sum over the keys in order, whatever the vector width.
template <typename Wide, typename In>
FLASHATTN_ROW_STEP void add_value_rows_impl(const float* probs, int rows, int64_t ld,
                                            const RowStream<In>& values, int dim, float* out,
                                            int64_t out_ld) {
  const int cols = values.count;
  prefetch_first_rows(values, dim);
  const int whole_wide = dim - dim % lanes<Wide>;
  const int whole = dim - dim % kVecWidth;
  for (int c0 = 0; c0 < cols; c0 += kValueBlock) {
    const int n_values = cols - c0 < kValueBlock ? cols - c0 : kValueBlock;
    for (int g = 0; g < values.heads; ++g) {  // each value through every head
      const NextRows<kValueBlock, In> next(values, c0 + kKeysAhead, g);
      const In* value[kValueBlock];
      for (int j = 0; j < kValueBlock; ++j)
        value[j] = values.rows[c0 + (j < n_values ? j : 0)] + g * values.head_stride;
      const float* probs_head = probs + int64_t(g) * rows * ld + c0;
      float* out_head = out + int64_t(g) * rows * out_ld;
      // A missing value adds 0 * 0, not 0 times a row (which might hold an inf).
      float p[kRowProductMaxRows][kValueBlock];
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < kValueBlock; ++j) p[r][j] = j < n_values ? probs_head[r * ld + j] : 0.f;
      accumulate_values<Wide>(p, rows, value, n_values, 0, whole_wide, next, out_head, out_ld);
      accumulate_values<VecF>(p, rows, value, n_values, whole_wide, whole, next, out_head,
                              out_ld);
      next.request(int64_t(whole) * sizeof(In), int64_t(dim) * sizeof(In));
      for (int d = whole; d < dim; ++d)
        for (int r = 0; r < rows; ++r)
          for (int j = 0; j < kValueBlock; ++j)
            out_head[r * out_ld + d] +=
                p[r][j] * (j < n_values ? static_cast<float>(value[j][d]) : 0.f);
    }
  }
}

// The 16-lane products, compiled for x86-64-v4 alone (called by the entry points below).
template <typename In>
FLASHATTN_AVX512 void dot_key_rows_16_lanes(const float* q, int rows, int64_t q_ld,
                                            const RowStream<In>& keys, int dim, float* scores,
                                            int64_t ld) {
  dot_key_rows_impl<VecF16>(q, rows, q_ld, keys, dim, scores, ld);
}

template <typename In>
FLASHATTN_AVX512 void add_value_rows_16_lanes(const float* probs, int rows, int64_t ld,
                                              const RowStream<In>& values, int dim, float* out,
                                              int64_t out_ld) {
  add_value_rows_impl<VecF16>(probs, rows, ld, values, dim, out, out_ld);
}

}  // namespace

bool runs_x86_64_v4() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool v4 = __builtin_cpu_supports("x86-64-v4");
  return v4;
#else
  return false;
#endif
}

bool runs_x86_64_v3() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool v3 = __builtin_cpu_supports("x86-64-v3");
  return v3;
#else
  return false;
#endif
}

RowLanes row_lanes() {
  const char* forced = std::getenv("FLASHATTN_CPU_ROW_LANES");
  const std::string value = forced == nullptr ? "" : forced;
  if (value.empty() || value == "auto") return runs_x86_64_v4() ? RowLanes::k16 : RowLanes::k8;
  TORCH_CHECK(value == "8" || value == "16", "flashattn: FLASHATTN_CPU_ROW_LANES must be 8, 16 or "
              "auto (or unset), got '", value, "'");
  TORCH_CHECK(value == "8" || runs_x86_64_v4(), "flashattn: FLASHATTN_CPU_ROW_LANES=16 needs "
              "AVX-512 (x86-64-v4: F, BW, CD, DQ, VL), which this CPU lacks");
  return value == "16" ? RowLanes::k16 : RowLanes::k8;
}

// The six entry points, one per operation and input type. Not templates: Clang does not
// multiversion those. Each takes 8 lanes in its own clones (AVX2, baseline) and calls the
// x86-64-v4 template for 16.
#define FLASHATTN_ROW_PRODUCTS_FOR(In)                                                       \
  FLASHATTN_EARLIER_VECTOR_CLONES void dot_key_rows(RowLanes lanes, const float* q, int rows, \
                                                    int64_t q_ld, const RowStream<In>& keys,   \
                                                    int dim, float* scores, int64_t ld) {      \
    if (lanes == RowLanes::k16)                                                               \
      return dot_key_rows_16_lanes(q, rows, q_ld, keys, dim, scores, ld);                     \
    dot_key_rows_impl<VecF>(q, rows, q_ld, keys, dim, scores, ld);                            \
  }                                                                                           \
  FLASHATTN_EARLIER_VECTOR_CLONES void add_value_rows(                                        \
      RowLanes lanes, const float* probs, int rows, int64_t ld, const RowStream<In>& values,  \
      int dim, float* out, int64_t out_ld) {                                                  \
    if (lanes == RowLanes::k16)                                                               \
      return add_value_rows_16_lanes(probs, rows, ld, values, dim, out, out_ld);              \
    add_value_rows_impl<VecF>(probs, rows, ld, values, dim, out, out_ld);                     \
  }

FLASHATTN_ROW_PRODUCTS_FOR(float)
FLASHATTN_ROW_PRODUCTS_FOR(c10::BFloat16)
FLASHATTN_ROW_PRODUCTS_FOR(c10::Half)
#undef FLASHATTN_ROW_PRODUCTS_FOR

}  // namespace flashattn::cpu
