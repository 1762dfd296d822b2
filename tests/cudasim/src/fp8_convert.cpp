// The FP8 (e4m3) conversions: thread instructions, counted per executing thread.
#include "fp8_convert.h"

#include <cmath>
#include <cstring>

#include "block.h"
#include "fp_bits.h"

namespace cudasim::detail {
namespace {

// f16 bits of an e4m3 code: every e4m3 value is an f16 value (3 mantissa bits of 10, exponents
// 2^-9 to 2^8 within f16's normal range), so the conversion is exact; NaN is f16's canonical
// 0x7fff, whatever the sign (as cuda_fp8.hpp's reference conversion).
uint16_t e4m3_to_f16_bits(uint8_t code) {
  const float value = e4m3_to_float(code);
  if (std::isnan(value)) return 0x7fffu;
  uint32_t f32;
  std::memcpy(&f32, &value, sizeof f32);
  const uint32_t sign = f32 >> 16 & 0x8000u;
  if ((f32 & 0x7fffffffu) == 0) return static_cast<uint16_t>(sign);
  // A normal f16: rebias the exponent, keep the top 10 mantissa bits (the rest are zero).
  const uint32_t exponent = (f32 >> 23 & 0xffu) - 127 + 15;
  return static_cast<uint16_t>(sign | exponent << 10 | (f32 & 0x7fffffu) >> 13);
}

}  // namespace

uint16_t cvt_e4m3x2_f32(float lo, float hi, const char* file, int line) {
  (void)file, (void)line;
  SimBlock& block = active_block("cvt.rn.satfinite.e4m3x2.f32");
  if (block.counters != nullptr) block.counters->cvt_e4m3x2_f32 += 1;
  return static_cast<uint16_t>(float_to_e4m3_satfinite(lo) | float_to_e4m3_satfinite(hi) << 8);
}

uint32_t cvt_f16x2_e4m3x2(uint16_t pair, const char* file, int line) {
  (void)file, (void)line;
  SimBlock& block = active_block("cvt.rn.f16x2.e4m3x2");
  if (block.counters != nullptr) block.counters->cvt_f16x2_e4m3x2 += 1;
  return e4m3_to_f16_bits(static_cast<uint8_t>(pair & 0xffu)) |
         static_cast<uint32_t>(e4m3_to_f16_bits(static_cast<uint8_t>(pair >> 8))) << 16;
}

}  // namespace cudasim::detail
