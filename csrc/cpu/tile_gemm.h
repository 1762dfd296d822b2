// One matrix product on a tile: C[M,N] (+)= A[M,K] · B[K,N], all row-major with leading
// dimensions in elements. The attention kernels arrange their operands (see packing.h) so every
// product they need has this one shape, with no transposes.
#pragma once
#include <ATen/native/CPUBlas.h>

#include <cstdint>

namespace flashattn::cpu {

// fp32: oneDNN's batch-reduce GEMM micro-kernel, JIT-compiled for the running CPU's ISA
// (AVX2, AVX-512, ...), so the wheel needs no ISA-specific compile flags.
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) C[m * ldc + n] = 0.f;
    return;
  }
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, accumulate, A, B, C, /*is_vnni=*/false);
}

// fp64 exists for gradcheck, where exactness matters and speed does not: plain loops.
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                      const double* B, int64_t ldb, double* C, int64_t ldc, bool accumulate) {
  for (int64_t m = 0; m < M; ++m) {
    double* c = C + m * ldc;
    if (!accumulate)
      for (int64_t n = 0; n < N; ++n) c[n] = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double a = A[m * lda + k];
      const double* b = B + k * ldb;
      for (int64_t n = 0; n < N; ++n) c[n] += a * b[n];
    }
  }
}

// brgemm keeps per-thread hardware state (AMX tile configuration); each worker thread calls
// this once when it has finished its tiles.
inline void release_tile_gemm() { at::native::cpublas::brgemm_release(/*is_vnni=*/false); }

}  // namespace flashattn::cpu
