// exp for fp32 built from plain arithmetic (no libm call, no table), so it vectorizes on any
// ISA: Cephes' expf. exp(x) = 2^n · exp(r) with n = round(x / ln2) and |r| <= ln2 / 2; exp(r)
// from a degree-6 polynomial; about 1 ulp over the whole range. Results below FLT_MIN are
// flushed to 0 (softmax weights that small do not change a fp32 sum), so exp(-inf) = 0.
// Inputs must be <= kMaxInput: the kernels only take exp of scores minus their maximum or
// their log-sum-exp, which are <= 0 (up to rounding). F is float or VecF (simd.h).
#pragma once
#include "simd.h"

namespace flashattn::cpu {

template <typename F>
inline F fast_exp(F x) {
  constexpr float kLog2e = 1.44269504088896341f;
  // ln2 split in a high part with few mantissa bits (n * kLn2High is exact) and the rest.
  constexpr float kLn2High = 0.693359375f;
  constexpr float kLn2Low = -2.12194440e-4f;
  // Beyond these, 2^n leaves the range of normal floats.
  [[maybe_unused]] constexpr float kMaxInput = 88.3762626647949f;
  constexpr float kMinInput = -87.3365447504019f;
  // Adding and subtracting 1.5 · 2^23 rounds a float of magnitude < 2^22 to an integer.
  constexpr float kRoundMagic = 12582912.f;
  constexpr int kExponentBias = 127;
  constexpr int kMantissaBits = 23;

  const F zero = F{};
  // Clamped below so -inf gives a defined integer n; the result is flushed to 0 at the end.
  const F clamped = select_max(x, zero + kMinInput);
  const F n = (clamped * kLog2e + kRoundMagic) - kRoundMagic;
  const F r = (clamped - n * kLn2High) - n * kLn2Low;
  F poly = zero + 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const F exp_r = poly * r * r + r + 1.f;
  const F result = exp_r * bits_to_float((to_int32(n) + kExponentBias) << kMantissaBits);
  return x < zero + kMinInput ? zero : result;
}

}  // namespace flashattn::cpu
