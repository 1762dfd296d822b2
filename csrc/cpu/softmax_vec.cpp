#include "softmax_vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "fast_exp.h"
#include "gemm_avx512_16bit.h"
#include "simd.h"

namespace flashattn::cpu {
namespace {

// Sum of the lanes in a fixed order, so the result does not depend on the target.
inline float reduce_add(VecF v) {
  float result = 0.f;
  for (int k = 0; k < kVecWidth; ++k) result += v[k];
  return result;
}

// Each fp32 kernel is a vector loop over whole VecF plus a scalar loop over the remainder.
template <typename VecOp, typename ScalarOp>
FLASHATTN_ROW_STEP void for_each_chunk(int n, const VecOp& vec_op, const ScalarOp& scalar_op) {
  int c = 0;
  for (; c + kVecWidth <= n; c += kVecWidth) vec_op(c);
  for (; c < n; ++c) scalar_op(c);
}

// Chunks of a row of n floats for a loop of width V: whole V, then (16 lanes) one whole VecF,
// then single floats. op(chunk, c) gets a value of the chunk's type (VecF16, VecF or float)
// and the chunk's first column.
template <typename V, typename Op>
FLASHATTN_ROW_STEP void for_each_chunk_of(int n, const Op& op) {
  int c = 0;
  if constexpr (lanes<V> == 16)
    for (; c + 16 <= n; c += 16) op(V{}, c);
  for (; c + 8 <= n; c += 8) op(VecF{}, c);
  for (; c < n; ++c) op(0.f, c);
}

template <typename W>
FLASHATTN_ROW_STEP W load_chunk(const float* x) {
  if constexpr (std::is_same_v<W, float>) {
    return *x;
  } else {
    return load<W>(x);
  }
}

using VecU32x8 = uint32_t __attribute__((vector_size(8 * sizeof(uint32_t))));
using VecU32x16 = uint32_t __attribute__((vector_size(16 * sizeof(uint32_t))));

// p[0 .. lanes of e) = e, in P: fp32, or rounded to nearest even in 16 bits as c10::BFloat16
// and c10::Half round a float. kBf16Insn (16 lanes, AVX512-BF16 CPUs): bf16 by vcvtneps2bf16,
// one instruction where the exact rounding takes five; it rounds to nearest even too but flushes
// a denormal input to zero, which for P (weights in [0, 1]) changes only weights below 2^-126.
template <bool kBf16Insn = false, typename P, typename W>
FLASHATTN_ROW_STEP void store_chunk(P* p, W e) {
  if constexpr (std::is_same_v<W, float>) {
    *p = P(e);
  } else if constexpr (std::is_same_v<P, float>) {
    store(p, e);
  } else if constexpr (kBf16Insn && std::is_same_v<P, c10::BFloat16> && lanes<W> == 16) {
    using VecU16x16 = uint16_t __attribute__((vector_size(16 * sizeof(uint16_t))));
    VecU16x16 narrow;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    asm("vcvtneps2bf16 {%1, %0|%0, %1}" : "=v"(narrow) : "v"(e));
#else  // never run (no AVX512-BF16 off x86), but compiled
    for (int i = 0; i < 16; ++i) narrow[i] = c10::BFloat16(e[i]).x;
#endif
    std::memcpy(p, &narrow, sizeof(narrow));
  } else if constexpr (std::is_same_v<P, c10::BFloat16>) {
    // bf16 is the top half of a float; adding 0x7FFF plus the lowest kept bit before
    // truncating rounds to nearest even, as c10::BFloat16(float) does (NaN stays NaN).
    using VecU32 = std::conditional_t<lanes<W> == 8, VecU32x8, VecU32x16>;
    const VecU32 bits = reinterpret_cast<VecU32>(e);
    const VecU32 rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    if constexpr (lanes<W> == 8) {
      using VecU16 = uint16_t __attribute__((vector_size(8 * sizeof(uint16_t))));
      const VecU16 narrow = __builtin_convertvector(rounded, VecU16);
      std::memcpy(p, &narrow, sizeof(narrow));
    } else {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      // One instruction; GCC 12 narrows 16 lanes in two halves (as it widens, row_products.cpp).
      asm("vpmovdw {%1, %0|%0, %1}" : "=m"(*reinterpret_cast<char(*)[32]>(p)) : "v"(rounded));
#else  // never run (row_lanes() is 8 off x86), but compiled
      for (int i = 0; i < 16; ++i) reinterpret_cast<uint16_t*>(p)[i] = uint16_t(rounded[i]);
#endif
    }
  } else {
    static_assert(std::is_same_v<P, c10::Half>, "P: float, c10::BFloat16 or c10::Half");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if constexpr (lanes<W> == 16) {
      // F16C's conversion, rounding to nearest even (imm 0) like c10::Half.
      asm("vcvtps2ph {$0, %1, %0|%0, %1, 0}" : "=m"(*reinterpret_cast<char(*)[32]>(p)) : "v"(e));
      return;
    }
#endif
    for (int i = 0; i < lanes<W>; ++i) p[i] = c10::Half(e[i]);
  }
}

// The row steps below are inlined into each tile function, and so compiled for its target.
// The largest lane, by halves: max is exact in any order (a NaN lane may or may not win, as in
// max_of_scaled_row's loop), and a tree is a short dependency chain.
FLASHATTN_ROW_STEP float reduce_max_tree(VecF v) {
  using Vec4 = float __attribute__((vector_size(4 * sizeof(float))));
  const Vec4 m4 = select_max(__builtin_shufflevector(v, v, 0, 1, 2, 3),
                             __builtin_shufflevector(v, v, 4, 5, 6, 7));
  return select_max(select_max(m4[0], m4[2]), select_max(m4[1], m4[3]));
}
FLASHATTN_ROW_STEP float reduce_max_tree(VecF16 v) {
  return reduce_max_tree(select_max(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                                    __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)));
}

// The sum of a 16-lane chunk sum and an 8-lane one, by halves (a tree: a dependency chain of
// 4 adds, not 15), in a fixed order, the same on every AVX-512 CPU.
FLASHATTN_ROW_STEP float reduce_add_tree(VecF16 wide, VecF half) {
  using Vec4 = float __attribute__((vector_size(4 * sizeof(float))));
  const VecF s8 = (__builtin_shufflevector(wide, wide, 0, 1, 2, 3, 4, 5, 6, 7) + half) +
                  __builtin_shufflevector(wide, wide, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) +
                  __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// The row steps below are inlined into each tile function, and so compiled for its target.
// max_c x[c] * scale.
template <typename V>
FLASHATTN_ROW_STEP float max_of_scaled_row(const float* x, int n, float scale) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Two accumulators for the whole chunks, alternately: two dependency chains, not one.
  V chunk_max[2] = {splat_to<V>(kNegInf), splat_to<V>(kNegInf)};
  VecF half_max = splat(kNegInf);
  float tail_max = kNegInf;
  int chunk = 0;
  for_each_chunk_of<V>(n, [&](auto piece, int c) {
    using W = decltype(piece);
    const W scaled = load_chunk<W>(x + c) * scale;
    if constexpr (std::is_same_v<W, V>) {
      chunk_max[chunk & 1] = select_max(chunk_max[chunk & 1], scaled);
      ++chunk;
    } else if constexpr (std::is_same_v<W, VecF>) {
      half_max = select_max(half_max, scaled);
    } else {
      tail_max = select_max(tail_max, scaled);
    }
  });
  float result = select_max(reduce_max_tree(select_max(chunk_max[0], chunk_max[1])), tail_max);
  if constexpr (lanes<V> == 16) result = select_max(result, reduce_max_tree(half_max));
  return result;
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_assoc_barrier)
#define FLASHATTN_HAVE_ASSOC_BARRIER 1
#endif
#endif

// x as computed: the compiler may not fuse the product that made it into the sum that takes it
// (GCC contracts a * b - c into one FMA, one rounding instead of two).
template <typename W>
FLASHATTN_ROW_STEP W rounded(W x) {
#if defined(FLASHATTN_HAVE_ASSOC_BARRIER)
  return __builtin_assoc_barrier(x);
#else
#if defined(__GNUC__) && !defined(__clang__)
  // GCC before 12 has no barrier: x goes through memory in an empty asm, which no contraction
  // can span (a register constraint cannot be met where the function has no registers of W's
  // width). A store and a load, on those compilers only. Clang contracts only within one
  // expression, so it needs neither.
  asm("" : "+m"(x));
#endif
  return x;
#endif
}

// p[c] = exp(x[c] * scale - shift) in P (p may be x itself); returns the sum of the exps in
// fp32: per lane of V over the whole chunks, then the 8-lane chunk (16 lanes), then the tail,
// each in a fixed order. 8 lanes give the bits of the 8-lane code before this; 16 lanes a
// different order, the same on every AVX-512 CPU. x * scale is rounded before the shift, so
// that scaling here gives the bits of scaling first (scale_by, then scale 1): a tile with row
// steps (fwd_online_softmax.h) and one without, and the backward's P (scaled first too), agree.
template <typename V, bool kBf16Insn, typename P>
FLASHATTN_ROW_STEP float exp_shifted_sum_row(const float* x, int n, float scale, float shift,
                                             P* p) {
  V chunk_sum = V{};
  VecF half_sum = VecF{};
  float tail_sum = 0.f;
  for_each_chunk_of<V>(n, [&](auto chunk, int c) {
    using W = decltype(chunk);
    const W scaled = rounded(load_chunk<W>(x + c) * scale);
    const W e = fast_exp(scaled - shift);
    store_chunk<kBf16Insn>(p + c, e);
    if constexpr (std::is_same_v<W, V>) {
      chunk_sum += e;
    } else if constexpr (std::is_same_v<W, VecF>) {
      half_sum += e;
    } else {
      tail_sum += e;
    }
  });
  if constexpr (lanes<V> == 16) {
    return reduce_add_tree(chunk_sum, half_sum) + tail_sum;
  } else {
    return reduce_add(chunk_sum) + tail_sum;
  }
}

// p[0 .. n) = x rounded, then zeros up to padded_n.
template <typename V, typename P>
FLASHATTN_ROW_STEP void store_probs_row(const float* x, P* p, int n, int padded_n) {
  for_each_chunk_of<V>(n, [&](auto chunk, int c) {
    store_chunk(p + c, load_chunk<decltype(chunk)>(x + c));
  });
  std::fill(p + n, p + padded_n, P(0.f));
}

FLASHATTN_ROW_STEP void scale_row(float* x, int n, float factor) {
  for_each_chunk(
      n, [&](int c) { store_vec(x + c, load_vec(x + c) * factor); },
      [&](int c) { x[c] *= factor; });
}

// A row of only -inf and NaN scores (a NaN in q or k behind a mask) may get -inf as its
// maximum; softmax makes all its weights NaN, and so does this. Returns whether it found a NaN.
template <typename T>
bool poison_if_nan(T* x, int n, T& row_sum) {
  if (std::none_of(x, x + n, [](T v) { return std::isnan(v); })) return false;
  std::fill(x, x + n, std::numeric_limits<T>::quiet_NaN());
  row_sum = std::numeric_limits<T>::quiet_NaN();
  return true;
}

// The forward's online-softmax step, written once for both widths (V: VecF or VecF16) and for
// P in place (fp32) or rounded to 16 bits into its own buffer. The widths give the same P, row
// maxima and O; the row sums differ in their order (exp_shifted_sum_row).
template <typename V, typename P, bool kBf16Insn = false>
FLASHATTN_ROW_STEP void online_softmax_rows(float* scores, int rows, int cols, int64_t ld,
                                            float scale, float* row_max, float* row_sum,
                                            float* out, int64_t out_ld, int dim, P* probs,
                                            int64_t probs_ld, int padded_cols) {
  constexpr bool kInPlace = std::is_same_v<P, float>;
  for (int r = 0; r < rows; ++r) {
    float* x = scores + r * ld;
    P* p = kInPlace ? reinterpret_cast<P*>(x) : probs + r * probs_ld;
    const float previous_max = row_max[r];
    // A NaN score may or may not end up as the maximum (select_max is order-dependent with
    // NaN); either way exp() below puts the NaN into P, the sum and O. Only beside scores that
    // are all -inf can it leave the maximum at -inf: poison_if_nan handles that row.
    const float new_max = select_max(previous_max, max_of_scaled_row<V>(x, cols, scale));
    if (new_max == -std::numeric_limits<float>::infinity()) {
      scale_row(x, cols, scale);
      // No key seen yet: contribute nothing (exp(-inf - -inf) would be NaN).
      if (!poison_if_nan(x, cols, row_sum[r])) std::fill(x, x + cols, 0.f);
      if constexpr (!kInPlace) store_probs_row<V>(x, p, cols, padded_cols);
      continue;
    }
    const float rescale = fast_exp(previous_max - new_max);  // 0 on the first visible tile
    row_sum[r] = row_sum[r] * rescale + exp_shifted_sum_row<V, kBf16Insn>(x, cols, scale, new_max, p);
    if constexpr (!kInPlace) std::fill(p + cols, p + padded_cols, P(0.f));
    if (rescale != 1.f) scale_row(out + r * out_ld, dim, rescale);
    row_max[r] = new_max;
  }
}

// The 16-lane steps, compiled for x86-64-v4 alone; row_lanes() is 16 only where it runs.
template <typename P, bool kBf16Insn = false>
FLASHATTN_AVX512 void online_softmax_rows_16_lanes(float* scores, int rows, int cols, int64_t ld,
                                                   float scale, float* row_max, float* row_sum,
                                                   float* out, int64_t out_ld, int dim,
                                                   P* probs, int64_t probs_ld, int padded_cols) {
  online_softmax_rows<VecF16, P, kBf16Insn>(scores, rows, cols, ld, scale, row_max, row_sum, out,
                                            out_ld, dim, probs, probs_ld, padded_cols);
}

}  // namespace

FLASHATTN_EARLIER_VECTOR_CLONES void online_softmax_tile(RowLanes lanes, float* scores, int rows,
                                                         int cols, int64_t ld, float* row_max,
                                                         float* row_sum, float* out,
                                                         int64_t out_ld, int dim) {
  if (lanes == RowLanes::k16)
    return online_softmax_rows_16_lanes<float>(scores, rows, cols, ld, 1.f, row_max, row_sum,
                                               out, out_ld, dim, nullptr, 0, cols);
  online_softmax_rows<VecF, float>(scores, rows, cols, ld, 1.f, row_max, row_sum, out, out_ld,
                                   dim, nullptr, 0, cols);
}

// Not a template: Clang does not multiversion those.
FLASHATTN_EARLIER_VECTOR_CLONES void online_softmax_tile(
    RowLanes lanes, float* scores, int rows, int cols, int64_t ld, float scale, float* row_max,
    float* row_sum, float* out, int64_t out_ld, int dim, c10::BFloat16* probs, int64_t probs_ld,
    int padded_cols) {
  if (lanes == RowLanes::k16) {
    if (avx512::cpu_has_avx512_bf16())
      return online_softmax_rows_16_lanes<c10::BFloat16, true>(
          scores, rows, cols, ld, scale, row_max, row_sum, out, out_ld, dim, probs, probs_ld,
          padded_cols);
    return online_softmax_rows_16_lanes<c10::BFloat16>(scores, rows, cols, ld, scale, row_max,
                                                       row_sum, out, out_ld, dim, probs,
                                                       probs_ld, padded_cols);
  }
  online_softmax_rows<VecF, c10::BFloat16>(scores, rows, cols, ld, scale, row_max, row_sum, out,
                                           out_ld, dim, probs, probs_ld, padded_cols);
}

FLASHATTN_EARLIER_VECTOR_CLONES void online_softmax_tile(
    RowLanes lanes, float* scores, int rows, int cols, int64_t ld, float scale, float* row_max,
    float* row_sum, float* out, int64_t out_ld, int dim, c10::Half* probs, int64_t probs_ld,
    int padded_cols) {
  if (lanes == RowLanes::k16)
    return online_softmax_rows_16_lanes<c10::Half>(scores, rows, cols, ld, scale, row_max,
                                                   row_sum, out, out_ld, dim, probs, probs_ld,
                                                   padded_cols);
  online_softmax_rows<VecF, c10::Half>(scores, rows, cols, ld, scale, row_max, row_sum, out,
                                       out_ld, dim, probs, probs_ld, padded_cols);
}

FLASHATTN_VECTOR_CLONES void exp_shifted_by_tile(float* x, int rows, int cols, int64_t ld,
                                                 const float* shift) {
  for (int r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    for_each_chunk(
        cols, [&](int c) { store_vec(row + c, fast_exp(load_vec(row + c) - load_vec(shift + c))); },
        [&](int c) { row[c] = fast_exp(row[c] - shift[c]); });
  }
}

FLASHATTN_VECTOR_CLONES void scale_by(float* x, int n, float factor) { scale_row(x, n, factor); }

FLASHATTN_VECTOR_CLONES void scale_rows_into(const float* x, int64_t ld_x, int rows, int n,
                                             float factor, float* out, int64_t ld_out) {
  for (int r = 0; r < rows; ++r) {
    const float* in = x + r * ld_x;
    float* to = out + r * ld_out;
    for_each_chunk(
        n, [&](int c) { store_vec(to + c, load_vec(in + c) * factor); },
        [&](int c) { to[c] = in[c] * factor; });
  }
}

// tanh has no cheap vector form here; softcap is off the hot path of most models.
void apply_softcap(float* x, int n, float softcap, float* tanh_out) {
  const float inv_softcap = 1.f / softcap;
  for (int c = 0; c < n; ++c) {
    const float t = std::tanh(x[c] * inv_softcap);
    x[c] = softcap * t;
    if (tanh_out != nullptr) tanh_out[c] = t;
  }
}

FLASHATTN_VECTOR_CLONES void add_alibi(float* x, int n, float slope, int first_distance,
                                       int distance_step) {
  for (int c = 0; c < n; ++c) {
    const int dist = first_distance + c * distance_step;
    x[c] -= slope * static_cast<float>(dist < 0 ? -dist : dist);
  }
}

FLASHATTN_VECTOR_CLONES void softmax_grad_tile(float* dp, const float* p, int rows, int cols,
                                               int64_t ld, const float* d) {
  for (int r = 0; r < rows; ++r) {
    float* dp_row = dp + r * ld;
    const float* p_row = p + r * ld;
    for_each_chunk(
        cols,
        [&](int c) {
          store_vec(dp_row + c, load_vec(p_row + c) * (load_vec(dp_row + c) - load_vec(d + c)));
        },
        [&](int c) { dp_row[c] = p_row[c] * (dp_row[c] - d[c]); });
  }
}

FLASHATTN_VECTOR_CLONES void mul_softcap_grad(float* ds, const float* t, int n) {
  for_each_chunk(
      n,
      [&](int c) {
        const VecF tv = load_vec(t + c);
        store_vec(ds + c, load_vec(ds + c) * (1.f - tv * tv));
      },
      [&](int c) { ds[c] *= 1.f - t[c] * t[c]; });
}

// store_chunk's rounding, as the forward's P gets it (bits as c10::BFloat16 / c10::Half give).
FLASHATTN_VECTOR_CLONES void round_to_16bit(const float* x, c10::BFloat16* out, int n) {
  store_probs_row<VecF>(x, out, n, n);
}

FLASHATTN_VECTOR_CLONES void round_to_16bit(const float* x, c10::Half* out, int n) {
  store_probs_row<VecF>(x, out, n, n);
}

void online_softmax_tile(double* scores, int rows, int cols, int64_t ld, double* row_max,
                         double* row_sum, double* out, int64_t out_ld, int dim) {
  for (int r = 0; r < rows; ++r) {
    double* x = scores + r * ld;
    double new_max = row_max[r];
    for (int c = 0; c < cols; ++c) new_max = select_max(new_max, x[c]);
    if (new_max == -std::numeric_limits<double>::infinity()) {
      if (poison_if_nan(x, cols, row_sum[r])) continue;
      std::fill(x, x + cols, 0.0);
      continue;
    }
    const double rescale = std::exp(row_max[r] - new_max);
    double sum = 0;
    for (int c = 0; c < cols; ++c) {
      x[c] = std::exp(x[c] - new_max);
      sum += x[c];
    }
    row_sum[r] = row_sum[r] * rescale + sum;
    if (rescale != 1.0)
      for (int d = 0; d < dim; ++d) out[r * out_ld + d] *= rescale;
    row_max[r] = new_max;
  }
}

void exp_shifted_by_tile(double* x, int rows, int cols, int64_t ld, const double* shift) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) x[r * ld + c] = std::exp(x[r * ld + c] - shift[c]);
}

void scale_by(double* x, int n, double factor) {
  for (int c = 0; c < n; ++c) x[c] *= factor;
}

void scale_rows_into(const double* x, int64_t ld_x, int rows, int n, double factor, double* out,
                     int64_t ld_out) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < n; ++c) out[r * ld_out + c] = x[r * ld_x + c] * factor;
}

void apply_softcap(double* x, int n, double softcap, double* tanh_out) {
  for (int c = 0; c < n; ++c) {
    const double t = std::tanh(x[c] / softcap);
    x[c] = softcap * t;
    if (tanh_out != nullptr) tanh_out[c] = t;
  }
}

void add_alibi(double* x, int n, double slope, int first_distance, int distance_step) {
  for (int c = 0; c < n; ++c) {
    const int dist = first_distance + c * distance_step;
    x[c] -= slope * static_cast<double>(dist < 0 ? -dist : dist);
  }
}

void softmax_grad_tile(double* dp, const double* p, int rows, int cols, int64_t ld,
                       const double* d) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dp[r * ld + c] = p[r * ld + c] * (dp[r * ld + c] - d[c]);
}

void mul_softcap_grad(double* ds, const double* t, int n) {
  for (int c = 0; c < n; ++c) ds[c] *= 1.0 - t[c] * t[c];
}

}  // namespace flashattn::cpu
