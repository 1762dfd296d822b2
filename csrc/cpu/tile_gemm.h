// One matrix product on a tile: C[M,N] (+)= A[M,K] · B[K,N], all row-major with leading
// dimensions in elements. The attention kernels arrange their operands (see packing.h) so every
// product they need has this one shape, with no transposes.
#pragma once
#include <ATen/native/CPUBlas.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "gemm_avx512_16bit.h"
#include "simd.h"

namespace flashattn::cpu {

// Products of at most this many multiply-adds run as plain loops: oneDNN's per-call cost (its
// kernel cache lookup and context, ~0.5 us) is more than such a product takes in loops. They
// come from short sequences: a backward tile of one query and one key is 5 products of 64.
constexpr int64_t kLoopProductMacs = 4096;

// C (+)= A B in plain loops, row by row, the inner loop along a chunk of C's row, so that a
// product gets the bits oneDNN's brgemm gives it (tile_gemm takes one or the other by size, and
// the forward and the backward tile the same scores differently; when their S differ, exp(S -
// lse) moves a one-hot row's P off 1):
//  - each element's products in K's order, summed from zero, then added to C once, as brgemm
//    adds its register sums (summing into C's running value also made one chain of roundings
//    through every product C had taken: a fp32 dV of one key that 2 x 127 queries see drifted
//    to 4x PyTorch's error);
//  - float products as fused multiply-adds where the CPU has them (x86-64-v3 up), as brgemm's
//    kernels for those CPUs take them, else a multiply and an add.
constexpr int64_t kLoopGemmChunk = 64;

template <bool kFused, typename T>
FLASHATTN_ROW_STEP T multiply_add(T a, T b, T c) {
  if constexpr (kFused)
    return __builtin_fmaf(a, b, c);
  else
    return a * b + c;
}

// Element (m, k) of A is A[m * a_m + k * a_k]; (k, n) of B is B[k * b_k + n * b_n] * b_factor
// if kScaledB, else B[k * b_k + n]. Two loop orders with the same roundings: along a chunk of
// C's row, vectorized, where B's rows are contiguous and C's rows are 8 wide or more; else
// element by element along K, the sum in a register (a vectorized strided B took gathers, and
// a 1-wide chunk's sum went through memory at every step: small backward products took 30%
// longer).
template <bool kFused, bool kScaledB, typename T>
FLASHATTN_ROW_STEP void loop_gemm_impl(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_m,
                                       int64_t a_k, const T* B, int64_t b_k, int64_t b_n,
                                       T b_factor, T* C, int64_t ldc, bool accumulate) {
  if ((kScaledB && b_n != 1) || N < 8) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        T sum = T(0);
        for (int64_t k = 0; k < K; ++k)
          sum = multiply_add<kFused>(A[m * a_m + k * a_k], B[k * b_k + n * b_n] * b_factor, sum);
        T& c = C[m * ldc + n];
        c = accumulate ? c + sum : sum;
      }
    return;
  }
  for (int64_t m = 0; m < M; ++m) {
    T* c = C + m * ldc;
    for (int64_t n0 = 0; n0 < N; n0 += kLoopGemmChunk) {
      const int64_t width = std::min(kLoopGemmChunk, N - n0);
      T sum[kLoopGemmChunk];  // only `width` of them: small products are often 1 wide
      for (int64_t n = 0; n < width; ++n) sum[n] = T(0);
      for (int64_t k = 0; k < K; ++k) {
        const T a = A[m * a_m + k * a_k];
        const T* b = B + k * b_k + n0;
        if constexpr (kScaledB)
          for (int64_t n = 0; n < width; ++n)
            sum[n] = multiply_add<kFused>(a, b[n] * b_factor, sum[n]);
        else
          for (int64_t n = 0; n < width; ++n) sum[n] = multiply_add<kFused>(a, b[n], sum[n]);
      }
      for (int64_t n = 0; n < width; ++n) c[n0 + n] = accumulate ? c[n0 + n] + sum[n] : sum[n];
    }
  }
}

template <bool kScaledB>
FLASHATTN_X86_64_V3 void loop_gemm_fused(int64_t M, int64_t N, int64_t K, const float* A,
                                         int64_t a_m, int64_t a_k, const float* B, int64_t b_k,
                                         int64_t b_n, float b_factor, float* C, int64_t ldc,
                                         bool accumulate) {
  loop_gemm_impl<true, kScaledB>(M, N, K, A, a_m, a_k, B, b_k, b_n, b_factor, C, ldc,
                                 accumulate);
}

template <bool kScaledB, typename T>
inline void loop_gemm_any(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_m, int64_t a_k,
                          const T* B, int64_t b_k, int64_t b_n, T b_factor, T* C, int64_t ldc,
                          bool accumulate) {
  if constexpr (std::is_same_v<T, float>)
    if (runs_x86_64_v3())
      return loop_gemm_fused<kScaledB>(M, N, K, A, a_m, a_k, B, b_k, b_n, b_factor, C, ldc,
                                       accumulate);
  loop_gemm_impl<false, kScaledB>(M, N, K, A, a_m, a_k, B, b_k, b_n, b_factor, C, ldc,
                                  accumulate);
}

template <typename T>
inline void loop_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                      int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  loop_gemm_any<false>(M, N, K, A, lda, 1, B, ldb, 1, T(1), C, ldc, accumulate);
}

// loop_gemm with A and B read through strides, B's elements times b_factor: element (m, k) of
// A is A[m * a_m + k * a_k], (k, n) of B is B[k * b_k + n * b_n] * b_factor. The operations of
// loop_gemm on copies of A and B laid out row-major (B multiplied by b_factor as it is copied)
// in the same order, so the same bits, without the copies.
template <typename T>
inline void loop_gemm_strided(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_m,
                              int64_t a_k, const T* B, int64_t b_k, int64_t b_n, T b_factor, T* C,
                              int64_t ldc, bool accumulate) {
  loop_gemm_any<true>(M, N, K, A, a_m, a_k, B, b_k, b_n, b_factor, C, ldc, accumulate);
}

// out[r] = a_r · b_r for `rows` pairs of rows (a_r at a + r * lda, b_r at b + r * ldb), each
// with the roundings tile_gemm gives an element of a product (loops and oneDNN alike, above):
// multiply-adds in k's order, from zero. The backward's D_i = dO_i · O_i takes it, so that at a
// row whose O_i is V_j (one key) it cancels exactly against that product's dP_ij = dO_i · V_j.
// The chains of kDotRows rows advance together: one chain alone waits a multiply-add's latency
// at every element (D_i of a (1, 16, 8, 64) backward took 4% of the call that way).
constexpr int kDotRows = 8;

template <bool kFused, typename T>
FLASHATTN_ROW_STEP void product_dots_impl(int64_t rows, const T* a, int64_t lda, const T* b,
                                          int64_t ldb, int64_t n, T* out) {
  int64_t r = 0;
  for (; r + kDotRows <= rows; r += kDotRows) {
    T sum[kDotRows];
    for (int i = 0; i < kDotRows; ++i) sum[i] = T(0);
    for (int64_t k = 0; k < n; ++k)
      for (int i = 0; i < kDotRows; ++i)
        sum[i] = multiply_add<kFused>(a[(r + i) * lda + k], b[(r + i) * ldb + k], sum[i]);
    for (int i = 0; i < kDotRows; ++i) out[r + i] = sum[i];
  }
  for (; r < rows; ++r) {
    T sum = T(0);
    for (int64_t k = 0; k < n; ++k) sum = multiply_add<kFused>(a[r * lda + k], b[r * ldb + k], sum);
    out[r] = sum;
  }
}

FLASHATTN_X86_64_V3 inline void product_dots_fused(int64_t rows, const float* a, int64_t lda,
                                                   const float* b, int64_t ldb, int64_t n,
                                                   float* out) {
  product_dots_impl<true>(rows, a, lda, b, ldb, n, out);
}

template <typename T>
inline void product_dots(int64_t rows, const T* a, int64_t lda, const T* b, int64_t ldb,
                         int64_t n, T* out) {
  if constexpr (std::is_same_v<T, float>)
    if (runs_x86_64_v3()) return product_dots_fused(rows, a, lda, b, ldb, n, out);
  product_dots_impl<false>(rows, a, lda, b, ldb, n, out);
}

// fp32: oneDNN's batch-reduce GEMM micro-kernel, JIT-compiled for the running CPU's ISA
// (AVX2, AVX-512, ...), so the wheel needs no ISA-specific compile flags; small products in
// loops. Which one runs depends only on the product's sizes, so a tile gets the same bits
// whatever else is in the call.
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (M * N * K <= kLoopProductMacs) {
    loop_gemm(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, accumulate, A, B, C, /*is_vnni=*/false);
}

// fp64 exists for gradcheck, where exactness matters and speed does not: plain loops.
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                      const double* B, int64_t ldb, double* C, int64_t ldc, bool accumulate) {
  loop_gemm(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

// The kernels that multiply 16-bit tiles: bf16/fp16 operands, fp32 accumulation. panels16.h
// chooses one per call (gemm16_kernel_for()); the tests force each one they can run.
enum class Gemm16Kernel : uint8_t {
  kRowMajor,   // oneDNN brgemm on a row-major B; converts internally without native 16-bit
               // products (slow): any CPU
  kAmx,        // oneDNN brgemm on B in ATen's pack() order: CPUs with AMX
  kAvx512Dot,  // vdpbf16ps on VNNI-2 B (gemm_avx512_16bit.h): AVX512-BF16, bf16 only
  kAvx512Fma,  // VNNI-2 B widened to fp32 and multiplied with FMAs: AVX-512, bf16 and fp16
};
constexpr int kNumGemm16Kernels = 4;

// The kernel the products with a packed (`vnni`) B use, per dtype (bf16, fp16): set by
// run_on_operand_path() (panels16.h) before each 16-bit call that packs, from the environment and
// the CPU, so calls running at once set the same value. kRowMajor until then.
inline std::atomic<Gemm16Kernel> packed_gemm16_kernel[2] = {Gemm16Kernel::kRowMajor,
                                                            Gemm16Kernel::kRowMajor};
template <typename In16>
std::atomic<Gemm16Kernel>& packed_gemm16_kernel_of() {
  return packed_gemm16_kernel[std::is_same_v<In16, c10::Half> ? 1 : 0];
}

// Tile products each kernel has run in this process (the tests check which one ran).
inline std::atomic<int64_t> gemm16_products[kNumGemm16Kernels] = {};

// C[M,N] (+)= A[M,K] · B[K,N], 16-bit A (row-major) and B, fp32 C, on `kernel`, which the CPU
// must have (panels16.h checks). B: row-major for kRowMajor, else a panel packed by
// pack_vnni_panel() (panels16.h) for that kernel.
template <typename In16>
inline void tile_gemm_16bit(Gemm16Kernel kernel, int64_t M, int64_t N, int64_t K, const In16* A,
                            int64_t lda, const In16* B, int64_t ldb, float* C, int64_t ldc,
                            bool accumulate) {
  static_assert(std::is_same_v<In16, c10::BFloat16> || std::is_same_v<In16, c10::Half>);
  constexpr bool kHalf = std::is_same_v<In16, c10::Half>;
  if (M == 0 || N == 0) return;
  gemm16_products[static_cast<int>(kernel)].fetch_add(1, std::memory_order_relaxed);
  const auto* a = reinterpret_cast<const uint16_t*>(A);
  const auto* b = reinterpret_cast<const uint16_t*>(B);
  switch (kernel) {
    case Gemm16Kernel::kRowMajor:
    case Gemm16Kernel::kAmx:
      at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, accumulate, A, B, C,
                                  /*is_vnni=*/kernel == Gemm16Kernel::kAmx);
      return;
    case Gemm16Kernel::kAvx512Dot:
      TORCH_INTERNAL_ASSERT(!kHalf, "flashattn: vdpbf16ps multiplies bf16 only");
      avx512::gemm_bf16_dot(M, N, K, a, lda, b, ldb, C, ldc, accumulate);
      return;
    case Gemm16Kernel::kAvx512Fma:
      (kHalf ? avx512::gemm_fp16_fma : avx512::gemm_bf16_fma)(M, N, K, a, lda, b, ldb, C, ldc,
                                                              accumulate);
      return;
  }
}

// The kernels' form: B is row-major, or (`vnni`) a panel that pack_vnni_panel() (panels16.h)
// packed for the call's kernel.
template <typename In16>
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const In16* A, int64_t lda, const In16* B,
                      int64_t ldb, float* C, int64_t ldc, bool accumulate, bool vnni) {
  const Gemm16Kernel kernel =
      vnni ? packed_gemm16_kernel_of<In16>().load(std::memory_order_relaxed)
           : Gemm16Kernel::kRowMajor;
  tile_gemm_16bit(kernel, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

// AMX keeps per-thread hardware state (the tile configuration); each worker thread calls this
// once when it has finished its tiles, with the `vnni` its products used.
inline void release_tile_gemm(bool vnni = false) {
  if (vnni && (packed_gemm16_kernel[0].load() == Gemm16Kernel::kAmx ||
               packed_gemm16_kernel[1].load() == Gemm16Kernel::kAmx))
    at::native::cpublas::brgemm_release(/*is_vnni=*/true);
}

}  // namespace flashattn::cpu
