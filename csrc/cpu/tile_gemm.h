// One matrix product on a tile: C[M,N] (+)= A[M,K] · B[K,N], all row-major with leading
// dimensions in elements. The attention kernels arrange their operands (see packing.h) so every
// product they need has this one shape, with no transposes.
#pragma once
#include <ATen/native/CPUBlas.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

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

// bf16/fp16 operands with fp32 accumulation: oneDNN's 16-bit brgemm (AMX or AVX-512 BF16/FP16
// where the CPU has them, converted internally elsewhere). B is row-major or, when `vnni`, a
// panel that pack_vnni_panel() (panels16.h) rearranged for AMX.
template <typename In16>
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const In16* A, int64_t lda, const In16* B,
                      int64_t ldb, float* C, int64_t ldc, bool accumulate, bool vnni) {
  static_assert(std::is_same_v<In16, c10::BFloat16> || std::is_same_v<In16, c10::Half>);
  if (M == 0 || N == 0) return;
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, accumulate, A, B, C, vnni);
}

// brgemm keeps per-thread hardware state (AMX tile configuration); each worker thread calls
// this once when it has finished its tiles, with the `vnni` its products used.
inline void release_tile_gemm(bool vnni = false) { at::native::cpublas::brgemm_release(vnni); }

}  // namespace flashattn::cpu
