// 16-bit tile products on AVX-512 CPUs without AMX: C[M,N] (+)= A[M,K] · B[K,N] with bf16 or
// fp16 operands and fp32 accumulation, B in VNNI-2 order. The functions are compiled for
// AVX-512 (gemm_avx512_16bit.cpp) in an extension built for baseline x86-64; call one only where
// the matching cpu_has_*() is true (panels16.h chooses).
//
// VNNI-2 order: pairs of B's rows interleaved, the layout vdpbf16ps multiplies. Pair-row p holds
// rows 2p and 2p+1: element (p, n, j) = B[2p + j][n], at p·2·ldb + 2·n + j; an odd K gets a zero
// row 2p+1 at its end. In a 32-bit lane the even row is the low half.
//
// Products are exact and every sum is an fp32 sum in the same order: per output, k pairs in
// order, and within pair p the product of row 2p+1 first, then that of row 2p (vdpbf16ps'
// order). The dot kernel (vdpbf16ps) treats bf16 subnormal inputs and fp32 subnormal results
// as zero; the fma kernels do not.
#pragma once
#include <cstdint>

namespace flashattn::cpu::avx512 {

// AVX-512 F, BW, VL and DQ, with the OS saving the ZMM state: what the fma kernels need.
bool cpu_has_avx512();
// ... and AVX512-BF16: what the dot kernel needs.
bool cpu_has_avx512_bf16();
// AVX512-FP16 (fp16 arithmetic). No kernel here uses it (its products accumulate in fp16); it
// marks the CPUs where the fp16 tile products are known to beat the fp32 path.
bool cpu_has_avx512_fp16();

// vdpbf16ps on bf16 (raw bits): per k pair and 16 columns, one instruction.
void gemm_bf16_dot(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
// bf16 / fp16 (raw bits) widened to fp32 (exactly) and multiplied with fp32 FMAs.
void gemm_bf16_fma(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);
void gemm_fp16_fma(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);

// Whether each kernel runs here and multiplies correctly: a product of small integers (exact in
// bf16/fp16 and fp32, so every order of the sums gives the same bits) against plain loops,
// checked once per kernel. A CPU or compiler where the result differs loses the kernel.
bool bf16_dot_works();
bool bf16_fma_works();
bool fp16_fma_works();

// Rearranges row-major in[rows][cols] (row stride ld_in) into VNNI-2 order with pair-row stride
// 2·ldb (ldb >= cols), rows rounded up to even with zeros. Plain C++: any CPU.
void pack_vnni2(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                int64_t ldb);

}  // namespace flashattn::cpu::avx512
