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

namespace flashattn::cpu {

// Products of at most this many multiply-adds run as plain loops: oneDNN's per-call cost (its
// kernel cache lookup and context, ~0.5 us) is more than such a product takes in loops. They
// come from short sequences: a backward tile of one query and one key is 5 products of 64.
constexpr int64_t kLoopProductMacs = 4096;

// C (+)= A B in plain loops, row by row, the inner loop along a chunk of C's row. A chunk's
// products are summed from zero and then added to C, as oneDNN's brgemm adds its register sums:
// summing into C's old value instead made one chain of roundings through every product C had
// taken, and a fp32 dV of one key that 2 x 127 queries see drifted to 4x PyTorch's error.
constexpr int64_t kLoopGemmChunk = 64;

template <typename T>
inline void loop_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                      int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  for (int64_t m = 0; m < M; ++m) {
    T* c = C + m * ldc;
    for (int64_t n0 = 0; n0 < N; n0 += kLoopGemmChunk) {
      const int64_t width = std::min(kLoopGemmChunk, N - n0);
      T sum[kLoopGemmChunk] = {};
      for (int64_t k = 0; k < K; ++k) {
        const T a = A[m * lda + k];
        const T* b = B + k * ldb + n0;
        for (int64_t n = 0; n < width; ++n) sum[n] += a * b[n];
      }
      for (int64_t n = 0; n < width; ++n) c[n0 + n] = accumulate ? c[n0 + n] + sum[n] : sum[n];
    }
  }
}

// loop_gemm with A and B read through strides, B's elements times b_factor: element (m, k) of
// A is A[m * a_m + k * a_k], (k, n) of B is B[k * b_k + n * b_n] * b_factor. The operations of
// loop_gemm on copies of A and B laid out row-major (B multiplied by b_factor as it is copied)
// in the same order, so the same bits, without the copies.
template <typename T>
inline void loop_gemm_strided(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_m,
                              int64_t a_k, const T* B, int64_t b_k, int64_t b_n, T b_factor, T* C,
                              int64_t ldc, bool accumulate) {
  for (int64_t m = 0; m < M; ++m) {
    T* c = C + m * ldc;
    for (int64_t n0 = 0; n0 < N; n0 += kLoopGemmChunk) {
      const int64_t width = std::min(kLoopGemmChunk, N - n0);
      T sum[kLoopGemmChunk] = {};
      for (int64_t k = 0; k < K; ++k) {
        const T a = A[m * a_m + k * a_k];
        const T* b = B + k * b_k + n0 * b_n;
        for (int64_t n = 0; n < width; ++n) sum[n] += a * (b[n * b_n] * b_factor);
      }
      for (int64_t n = 0; n < width; ++n) c[n0 + n] = accumulate ? c[n0 + n] + sum[n] : sum[n];
    }
  }
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
