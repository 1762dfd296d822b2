// FP8 (e4m3) conversions, for the FP8 forward's P (f32 after softmax) into wgmma's register A
// fragment: cvt.rn.satfinite.e4m3x2.f32 and its reverse, cvt.rn.f16x2.e4m3x2 (sm_89+).
// Included by ptx.cuh (for the shim and sm_89+ device passes); include ptx.cuh, not this file.
// Under the shim each wrapper calls cudasim's emulation (tests/cudasim/src/fp8_convert.cpp).
//
// The rules, per the PTX ISA ("cvt"): e4m3 has no infinities (S.1111.111 is NaN, 448 the
// largest finite value) and .satfinite is mandatory for f32 -> e4m3x2: round to nearest even,
// magnitudes past 448 (infinity too) become +-448, NaN becomes NaN (0x7f). Of the two sources
// of the PTX instruction (d, a, b) a goes to the upper byte and b to the lower one; the
// wrappers take (lo, hi) so that lo is the element at the lower address once stored.
#pragma once
#include <cstdint>

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
#include "src/fp8_convert.h"
#endif

namespace flashattn {
namespace ptx {

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)

// Two f32 to a pair of e4m3: lo into bits 0-7, hi into bits 8-15.
FLASHATTN_PTX_DEVICE uint16_t cvt_e4m3x2_f32(float lo, float hi FLASHATTN_PTX_SITE) {
  return ::cudasim::detail::cvt_e4m3x2_f32(lo, hi, file, line);
}
// A pair of e4m3 to two f16 (exact; NaN to 0x7fff): bits 0-7 into the low half.
FLASHATTN_PTX_DEVICE uint32_t cvt_f16x2_e4m3x2(uint16_t pair FLASHATTN_PTX_SITE) {
  return ::cudasim::detail::cvt_f16x2_e4m3x2(pair, file, line);
}

#else  // nvcc

FLASHATTN_PTX_DEVICE uint16_t cvt_e4m3x2_f32(float lo, float hi) {
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
}
FLASHATTN_PTX_DEVICE uint32_t cvt_f16x2_e4m3x2(uint16_t pair) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(pair));
  return halves;
}

#endif

}  // namespace ptx
}  // namespace flashattn
