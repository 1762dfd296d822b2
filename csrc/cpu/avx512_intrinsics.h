// What the kernels compiled per target with AVX-512 intrinsics share (gemm_avx512_16bit.cpp,
// row_products_dot.cpp): the intrinsics header, the target attributes, and the lane masks of a
// tail. The extension is built for baseline x86-64, so each function that uses an intrinsic
// carries FA_AVX512 or FA_AVX512_BF16 and runs only where the CPU has it.
#pragma once
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLASHATTN_HAVE_AVX512_KERNELS 1
#include <immintrin.h>
// GCC 12 warns that its own intrinsics' _mm512_undefined_*() "may be used uninitialized".
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define FA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define FA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define FA_INLINE __attribute__((always_inline)) inline

namespace flashattn::cpu::avx512 {

// Lanes [0, n) of a 16-lane vector (none for n <= 0, all for n >= 16).
FA_INLINE __mmask16 lanes16(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Lanes [0, n) of a 32-lane vector (none for n <= 0, all for n >= 32).
FA_INLINE __mmask32 lanes32(int64_t n) {
  return n >= 32 ? ~__mmask32(0) : n <= 0 ? __mmask32(0) : (__mmask32(1) << n) - 1;
}

}  // namespace flashattn::cpu::avx512
#endif
