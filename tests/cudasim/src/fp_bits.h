// Exact f16 / bf16 bit patterns to float, independent of cuda_fp16.h. Internal to the shim.
#pragma once
#include <cstdint>
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

}  // namespace cudasim::detail
