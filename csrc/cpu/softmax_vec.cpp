#include "softmax_vec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "fast_exp.h"
#include "simd.h"

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
inline void for_each_chunk(int n, const VecOp& vec_op, const ScalarOp& scalar_op) {
  int c = 0;
  for (; c + kVecWidth <= n; c += kVecWidth) vec_op(c);
  for (; c < n; ++c) scalar_op(c);
}

}  // namespace

FLASHATTN_VECTOR_CLONES float max_of(const float* x, int n) {
  VecF lane_max = splat(-std::numeric_limits<float>::infinity());
  float tail_max = -std::numeric_limits<float>::infinity();
  for_each_chunk(
      n, [&](int c) { lane_max = select_max(lane_max, load_vec(x + c)); },
      [&](int c) { tail_max = select_max(tail_max, x[c]); });
  return select_max(reduce_max(lane_max), tail_max);
}

FLASHATTN_VECTOR_CLONES float exp_shifted_sum(float* x, int n, float shift) {
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

FLASHATTN_VECTOR_CLONES void exp_shifted_by(float* x, const float* shift, int n) {
  for_each_chunk(
      n, [&](int c) { store_vec(x + c, fast_exp(load_vec(x + c) - load_vec(shift + c))); },
      [&](int c) { x[c] = fast_exp(x[c] - shift[c]); });
}

FLASHATTN_VECTOR_CLONES void scale_by(float* x, int n, float factor) {
  for_each_chunk(
      n, [&](int c) { store_vec(x + c, load_vec(x + c) * factor); },
      [&](int c) { x[c] *= factor; });
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

FLASHATTN_VECTOR_CLONES void softmax_grad(float* dp, const float* p, const float* d, int n) {
  for_each_chunk(
      n,
      [&](int c) {
        store_vec(dp + c, load_vec(p + c) * (load_vec(dp + c) - load_vec(d + c)));
      },
      [&](int c) { dp[c] = p[c] * (dp[c] - d[c]); });
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

double max_of(const double* x, int n) {
  double result = -std::numeric_limits<double>::infinity();
  for (int c = 0; c < n; ++c) result = select_max(result, x[c]);
  return result;
}

double exp_shifted_sum(double* x, int n, double shift) {
  double sum = 0;
  for (int c = 0; c < n; ++c) {
    x[c] = std::exp(x[c] - shift);
    sum += x[c];
  }
  return sum;
}

void exp_shifted_by(double* x, const double* shift, int n) {
  for (int c = 0; c < n; ++c) x[c] = std::exp(x[c] - shift[c]);
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

void softmax_grad(double* dp, const double* p, const double* d, int n) {
  for (int c = 0; c < n; ++c) dp[c] = p[c] * (dp[c] - d[c]);
}

void mul_softcap_grad(double* ds, const double* t, int n) {
  for (int c = 0; c < n; ++c) ds[c] *= 1.0 - t[c] * t[c];
}

}  // namespace flashattn::cpu
