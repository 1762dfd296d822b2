#include "softmax_vec.h"

#include <cmath>
#include <limits>

#include "fast_exp.h"

// The extension is built for baseline x86-64 (it must load on any machine), so the fp32 loops
// are compiled three times, for AVX-512, AVX2+FMA and the baseline, and the loader picks the
// best for the running CPU once (GCC/Clang function multi-versioning).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLASHATTN_VECTOR_CLONES
#endif

namespace flashattn::cpu {
namespace {

// Reductions keep this many independent partial results, so the compiler can use full vector
// registers without reassociating (the sum order is fixed: results are reproducible). 16 fills
// one AVX-512 register or two AVX2 ones.
constexpr int kLanes = 16;

inline float exp_of(float x) { return fast_exp(x); }
inline double exp_of(double x) { return std::exp(x); }

template <typename T>
inline T max_of_impl(const T* x, int n) {
  T lane_max[kLanes];
  for (int k = 0; k < kLanes; ++k) lane_max[k] = -std::numeric_limits<T>::infinity();
  int c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int k = 0; k < kLanes; ++k) lane_max[k] = x[c + k] > lane_max[k] ? x[c + k] : lane_max[k];
  for (; c < n; ++c) lane_max[0] = x[c] > lane_max[0] ? x[c] : lane_max[0];
  T result = lane_max[0];
  for (int k = 1; k < kLanes; ++k) result = lane_max[k] > result ? lane_max[k] : result;
  return result;
}

template <typename T>
inline T exp_shifted_sum_impl(T* x, int n, T shift) {
  T lane_sum[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      x[c + k] = exp_of(x[c + k] - shift);
      lane_sum[k] += x[c + k];
    }
  for (; c < n; ++c) {
    x[c] = exp_of(x[c] - shift);
    lane_sum[0] += x[c];
  }
  T result = 0;
  for (int k = 0; k < kLanes; ++k) result += lane_sum[k];
  return result;
}

template <typename T>
inline void exp_shifted_by_impl(T* x, const T* shift, int n) {
  for (int c = 0; c < n; ++c) x[c] = exp_of(x[c] - shift[c]);
}

template <typename T>
inline void scale_by_impl(T* x, int n, T factor) {
  for (int c = 0; c < n; ++c) x[c] *= factor;
}

template <typename T>
inline void apply_softcap_impl(T* x, int n, T softcap, T* tanh_out) {
  const T inv_softcap = T(1) / softcap;
  for (int c = 0; c < n; ++c) {
    const T t = std::tanh(x[c] * inv_softcap);
    x[c] = softcap * t;
    if (tanh_out != nullptr) tanh_out[c] = t;
  }
}

template <typename T>
inline void add_alibi_impl(T* x, int n, T slope, int first_distance, int distance_step) {
  for (int c = 0; c < n; ++c) {
    const int dist = first_distance + c * distance_step;
    x[c] -= slope * static_cast<T>(dist < 0 ? -dist : dist);
  }
}

template <typename T>
inline void softmax_grad_impl(T* dp, const T* p, const T* d, int n) {
  for (int c = 0; c < n; ++c) dp[c] = p[c] * (dp[c] - d[c]);
}

template <typename T>
inline void mul_softcap_grad_impl(T* ds, const T* t, int n) {
  for (int c = 0; c < n; ++c) ds[c] *= T(1) - t[c] * t[c];
}

}  // namespace

FLASHATTN_VECTOR_CLONES float max_of(const float* x, int n) { return max_of_impl(x, n); }
double max_of(const double* x, int n) { return max_of_impl(x, n); }

FLASHATTN_VECTOR_CLONES float exp_shifted_sum(float* x, int n, float shift) {
  return exp_shifted_sum_impl(x, n, shift);
}
double exp_shifted_sum(double* x, int n, double shift) {
  return exp_shifted_sum_impl(x, n, shift);
}

FLASHATTN_VECTOR_CLONES void exp_shifted_by(float* x, const float* shift, int n) {
  exp_shifted_by_impl(x, shift, n);
}
void exp_shifted_by(double* x, const double* shift, int n) { exp_shifted_by_impl(x, shift, n); }

FLASHATTN_VECTOR_CLONES void scale_by(float* x, int n, float factor) {
  scale_by_impl(x, n, factor);
}
void scale_by(double* x, int n, double factor) { scale_by_impl(x, n, factor); }

FLASHATTN_VECTOR_CLONES void apply_softcap(float* x, int n, float softcap, float* tanh_out) {
  apply_softcap_impl(x, n, softcap, tanh_out);
}
void apply_softcap(double* x, int n, double softcap, double* tanh_out) {
  apply_softcap_impl(x, n, softcap, tanh_out);
}

FLASHATTN_VECTOR_CLONES void add_alibi(float* x, int n, float slope, int first_distance,
                                       int distance_step) {
  add_alibi_impl(x, n, slope, first_distance, distance_step);
}
void add_alibi(double* x, int n, double slope, int first_distance, int distance_step) {
  add_alibi_impl(x, n, slope, first_distance, distance_step);
}

FLASHATTN_VECTOR_CLONES void softmax_grad(float* dp, const float* p, const float* d, int n) {
  softmax_grad_impl(dp, p, d, n);
}
void softmax_grad(double* dp, const double* p, const double* d, int n) {
  softmax_grad_impl(dp, p, d, n);
}

FLASHATTN_VECTOR_CLONES void mul_softcap_grad(float* ds, const float* t, int n) {
  mul_softcap_grad_impl(ds, t, n);
}
void mul_softcap_grad(double* ds, const double* t, int n) { mul_softcap_grad_impl(ds, t, n); }

}  // namespace flashattn::cpu
