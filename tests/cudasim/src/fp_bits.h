// Exact f16 / bf16 / e4m3 bit patterns to float, and float to e4m3, independent of cuda_fp16.h
// and cuda_fp8.h. Internal to the shim.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>

namespace cudasim::detail {

inline float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return float_from_bits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // zero or subnormal, exact
    return sign ? -magnitude : magnitude;
  }
  return float_from_bits(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

inline float bf16_to_float(uint16_t b) { return float_from_bits(static_cast<uint32_t>(b) << 16); }

// e4m3 (the PTX ISA's .e4m3, OCP's E4M3 "fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits;
// no infinities: S.1111.111 is NaN and 448 (0x7e) the largest finite value; exponent 0 is
// subnormal, mantissa * 2^-9. Every code is exact in float.
constexpr uint8_t kE4m3Nan = 0x7f;
constexpr uint8_t kE4m3MaxFinite = 0x7e;  // 448
inline float e4m3_to_float(uint8_t code) {
  const float sign = (code & 0x80u) != 0 ? -1.f : 1.f;
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
}

// cvt.rn.satfinite.e4m3x2.f32, one half: round to nearest even; a magnitude past the largest
// finite value (infinity included) saturates to +-448 (values in (448, 464] round there anyway,
// and .satfinite clamps the rest); NaN becomes the positive NaN 0x7f (the sign is dropped, as
// cuda_fp8.hpp's reference conversion does); zero keeps its sign.
inline uint8_t float_to_e4m3_satfinite(float x) {
  if (std::isnan(x)) return kE4m3Nan;
  const uint8_t sign = std::signbit(x) ? 0x80u : 0u;
  const double magnitude = std::fabs(static_cast<double>(x));
  if (magnitude >= 448.0) return sign | kE4m3MaxFinite;
  if (magnitude == 0.0) return sign;
  // The quantum of x's binade: 2^(floor(log2 |x|) - 3), but never below the subnormal 2^-9.
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  const int quantum = std::max(exponent - 1, -6) - 3;
  // Quanta in [0, 16]: rounding half to even under the default rounding mode; scaling by a
  // power of two is exact in double. 16 quanta carry into the next binade's code on their own.
  const int quanta = static_cast<int>(std::nearbyint(std::ldexp(magnitude, -quantum)));
  return static_cast<uint8_t>(sign | (((quantum + 9) << 3) + quanta));
}

}  // namespace cudasim::detail
