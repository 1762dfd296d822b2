#include "softmax_vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "fast_exp.h"
#include "simd.h"

namespace flashattn::cpu {
namespace {

// Sum of the lanes in a fixed order, so the result does not depend on the target.
inline float reduce_add(VecF v) {
  float result = 0.f;
  for (int k = 0; k < kVecWidth; ++k) result += v[k];
  return result;
}

inline float reduce_max(VecF v) {
  float result = v[0];
  for (int k = 1; k < kVecWidth; ++k) result = select_max(result, v[k]);
  return result;
}

// Each fp32 kernel is a vector loop over whole VecF plus a scalar loop over the remainder.
template <typename VecOp, typename ScalarOp>
FLASHATTN_ROW_STEP void for_each_chunk(int n, const VecOp& vec_op, const ScalarOp& scalar_op) {
  int c = 0;
  for (; c + kVecWidth <= n; c += kVecWidth) vec_op(c);
  for (; c < n; ++c) scalar_op(c);
}

// The row steps below are inlined into each tile function, and so compiled for its target.
FLASHATTN_ROW_STEP float max_of_row(const float* x, int n) {
  VecF lane_max = splat(-std::numeric_limits<float>::infinity());
  float tail_max = -std::numeric_limits<float>::infinity();
  for_each_chunk(
      n, [&](int c) { lane_max = select_max(lane_max, load_vec(x + c)); },
      [&](int c) { tail_max = select_max(tail_max, x[c]); });
  return select_max(reduce_max(lane_max), tail_max);
}

// x[c] = exp(x[c] - shift); returns the sum of the new x.
FLASHATTN_ROW_STEP float exp_shifted_sum_row(float* x, int n, float shift) {
  VecF lane_sum = VecF{};
  float tail_sum = 0.f;
  for_each_chunk(
      n,
      [&](int c) {
        const VecF e = fast_exp(load_vec(x + c) - shift);
        store_vec(x + c, e);
        lane_sum += e;
      },
      [&](int c) {
        x[c] = fast_exp(x[c] - shift);
        tail_sum += x[c];
      });
  return reduce_add(lane_sum) + tail_sum;
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

}  // namespace

FLASHATTN_VECTOR_CLONES void online_softmax_tile(float* scores, int rows, int cols, int64_t ld,
                                                 float* row_max, float* row_sum, float* out,
                                                 int64_t out_ld, int dim) {
  for (int r = 0; r < rows; ++r) {
    float* x = scores + r * ld;
    const float previous_max = row_max[r];
    // A NaN score may or may not end up as the maximum (select_max is order-dependent with
    // NaN); either way exp() below puts the NaN into P, the sum and O. Only beside scores that
    // are all -inf can it leave the maximum at -inf: poison_if_nan handles that row.
    const float new_max = select_max(previous_max, max_of_row(x, cols));
    if (new_max == -std::numeric_limits<float>::infinity()) {
      if (poison_if_nan(x, cols, row_sum[r])) continue;
      // No key seen yet: contribute nothing (exp(-inf - -inf) would be NaN).
      std::fill(x, x + cols, 0.f);
      continue;
    }
    const float rescale = fast_exp(previous_max - new_max);  // 0 on the first visible tile
    row_sum[r] = row_sum[r] * rescale + exp_shifted_sum_row(x, cols, new_max);
    if (rescale != 1.f) scale_row(out + r * out_ld, dim, rescale);
    row_max[r] = new_max;
  }
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

FLASHATTN_VECTOR_CLONES void round_to_16bit(const float* x, c10::BFloat16* out, int n) {
  // bf16 is the top half of a float; adding 0x7FFF plus the lowest kept bit before truncating
  // rounds to nearest even, exactly as c10::BFloat16(float) does for finite values.
  using VecU32 = uint32_t __attribute__((vector_size(kVecWidth * sizeof(uint32_t))));
  using VecU16 = uint16_t __attribute__((vector_size(kVecWidth * sizeof(uint16_t))));
  for_each_chunk(
      n,
      [&](int c) {
        const VecU32 bits = reinterpret_cast<VecU32>(load_vec(x + c));
        const VecU32 rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
        const VecU16 narrow = __builtin_convertvector(rounded, VecU16);
        std::memcpy(out + c, &narrow, sizeof(narrow));
      },
      [&](int c) { out[c] = c10::BFloat16(x[c]); });
}

void round_to_16bit(const float* x, c10::Half* out, int n) {
  for (int c = 0; c < n; ++c) out[c] = c10::Half(x[c]);
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
