// The shim's entry points for the FP8 conversions of csrc/cuda/ptx_fp8.cuh, each with the
// kernel's call site; the rounding and NaN rules are in fp_bits.h. Standalone (the wrappers
// include it).
#pragma once
#include <cstdint>

namespace cudasim::detail {

// cvt.rn.satfinite.e4m3x2.f32 d, hi, lo: lo into bits 0-7 of d, hi into bits 8-15.
uint16_t cvt_e4m3x2_f32(float lo, float hi, const char* file, int line);
// cvt.rn.f16x2.e4m3x2 d, pair: each byte to f16, exactly (NaN to 0x7fff); the low byte into the
// low half of d.
uint32_t cvt_f16x2_e4m3x2(uint16_t pair, const char* file, int line);

}  // namespace cudasim::detail
