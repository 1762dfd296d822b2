// exp for fp32 built from plain arithmetic (no libm call, no table), so it vectorizes on any
// ISA: Cephes' expf. exp(x) = 2^n · exp(r) with n = round(x / ln2) and |r| <= ln2 / 2; exp(r)
// from a degree-7 polynomial; at most 1.26 ulp from exp over [-87.3, 0] (measured against
// double exp at 8.7 million points; Horner's order gave 1.02 ulp but took about a quarter
// more time in the softmax loops).
// From -88.03 (-127 ln2) down, including -inf, the result is exactly 0; softmax weights that
// small do not change a fp32 sum. exp(NaN) is NaN. Inputs must stay below 88.7, where 2^n
// overflows: the kernels only take exp of scores minus their maximum or their log-sum-exp,
// which are <= 0 (up to rounding). F is float or VecF (simd.h).
#pragma once
#include "simd.h"

namespace flashattn::cpu {

template <typename F>
__attribute__((always_inline)) inline F fast_exp(F x) {
  constexpr float kLog2e = 1.44269504088896341f;
  // ln2 split in a high part with few mantissa bits (n * kLn2High is exact) and the rest.
  constexpr float kLn2High = 0.693359375f;
  constexpr float kLn2Low = -2.12194440e-4f;
  // -127 ln2: from here down n = -127, whose 2^n below has all bits 0, so the result is
  // exactly 0 (exp(-inf) included) without a compare and select.
  constexpr float kFlushBelow = -88.0296919311f;
  // Adding and subtracting 1.5 · 2^23 rounds a float of magnitude < 2^22 to an integer.
  constexpr float kRoundMagic = 12582912.f;
  constexpr int32_t kExponentBias = 127;
  constexpr int kMantissaBits = 23;

  const F zero = F{};
  // In this order a NaN passes through (and makes a NaN result), as in exp.
  const F clamped = select_max(zero + kFlushBelow, x);
  // x / ln2 + kRoundMagic holds n = round(x / ln2) in its low mantissa bits.
  const F shifted_n = clamped * kLog2e + kRoundMagic;
  const F n = shifted_n - kRoundMagic;
  const F r = (clamped - n * kLn2High) - n * kLn2Low;
  // exp(r) = 1 + r + r^2 (c0 + c1 r + ... + c5 r^5), the polynomial in Estrin's scheme: three
  // short independent chains instead of Horner's one long chain, which was the loops' latency.
  const F r2 = r * r;
  const F c01 = r * 1.6666665459e-1f + 5.0000001201e-1f;
  const F c23 = r * 8.3334519073e-3f + 4.1665795894e-2f;
  const F c45 = r * 1.9875691500e-4f + 1.3981999507e-3f;
  const F poly = (c45 * r2 + c23) * r2 + c01;
  const F exp_r = poly * r2 + (r + 1.f);
  // 2^n: n + kExponentBias in the exponent field, read from shifted_n's bits (which are those
  // of kRoundMagic plus n) without a float-to-int conversion; n + 127 is in [0, 255].
  const auto n_bits = float_to_bits(shifted_n) + (kExponentBias - float_to_bits(kRoundMagic));
  return exp_r * bits_to_float(n_bits << kMantissaBits);
}

}  // namespace flashattn::cpu
