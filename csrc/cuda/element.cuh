// The two 16-bit element types the tensor-core kernels take, and the few operations that
// differ between them: which mma to issue and how to round fp32 pairs into a packed register.
//
// Kernels move 16-bit data as raw bits (uint16_t) and only name the element type here, so they
// never depend on __half/__nv_bfloat16 operators (torch builds with __CUDA_NO_HALF_OPERATORS__).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ptx.cuh"

namespace flashattn::cuda {

template <typename Element>
inline constexpr bool kIs16BitElement =
    std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>;

// d += A (16x16, row) * B (16x8, col), fp32 accumulation.
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]) {
  static_assert(kIs16BitElement<Element>, "tensor-core path takes fp16 or bf16");
  if constexpr (std::is_same_v<Element, __half>) {
    ptx::mma_m16n8k16_f16(d, a, b);
  } else {
    ptx::mma_m16n8k16_bf16(d, a, b);
  }
}

// Rounds (lo, hi) to two elements packed in one register, lo in the low 16 bits: the layout
// of an mma A/B fragment register and of two consecutive elements in memory.
template <typename Element>
__device__ __forceinline__ uint32_t pack_rn(float lo, float hi) {
  static_assert(kIs16BitElement<Element>, "tensor-core path takes fp16 or bf16");
  uint32_t bits;
  if constexpr (std::is_same_v<Element, __half>) {
    const __half2 pair = __floats2half2_rn(lo, hi);
    static_assert(sizeof(pair) == sizeof(bits), "half2 is two 16-bit halves");
    memcpy(&bits, &pair, sizeof(bits));
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    static_assert(sizeof(pair) == sizeof(bits), "bfloat162 is two 16-bit halves");
    memcpy(&bits, &pair, sizeof(bits));
  }
  return bits;
}

// The value of one element stored as raw bits.
template <typename Element>
__device__ __forceinline__ float to_float(uint16_t bits) {
  static_assert(kIs16BitElement<Element>, "tensor-core path takes fp16 or bf16");
  if constexpr (std::is_same_v<Element, __half>) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  } else {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
}

// One element's bits, rounded to nearest even from fp32.
template <typename Element>
__device__ __forceinline__ uint16_t from_float(float x) {
  static_assert(kIs16BitElement<Element>, "tensor-core path takes fp16 or bf16");
  if constexpr (std::is_same_v<Element, __half>) {
    const __half_raw raw = __float2half_rn(x);
    return raw.x;
  } else {
    const __nv_bfloat16_raw raw = __float2bfloat16_rn(x);
    return raw.x;
  }
}

// A 16-bit element as its bits, converted to and from float only explicitly: host-device code
// written for c10::Half-like types (kv_append.h) casts, and torch builds with
// __CUDA_NO_HALF_CONVERSIONS__.
template <typename Element>
struct Bits16 {
  uint16_t bits;
  Bits16() = default;
  __device__ __forceinline__ explicit Bits16(float x) : bits(from_float<Element>(x)) {}
  __device__ __forceinline__ explicit operator float() const { return to_float<Element>(bits); }
};

// How kernels that cast elements (rather than move bits) hold an Element in memory.
template <typename Element>
using StoredElement = std::conditional_t<kIs16BitElement<Element>, Bits16<Element>, Element>;

}  // namespace flashattn::cuda
