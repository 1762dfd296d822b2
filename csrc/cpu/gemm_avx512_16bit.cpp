// The AVX-512 16-bit tile products (gemm_avx512_16bit.h). Each kernel function is compiled for
// the ISA it needs with __attribute__((target)), the rest of the extension for baseline x86-64;
// panels16.h calls them only after cpu_has_*() said yes, so no CPU runs an instruction it lacks.
//
// Blocking: columns in blocks of 64 (one panel, four zmm), rows in blocks of kRowBlock = 6.
// A block's 6 x 64 fp32 accumulators take 24 of the 32 zmm registers, B's four vectors four more;
// A's values are broadcast from memory (vpbroadcastd / vbroadcastss: a load, no arithmetic).
// Per k pair and block, the dot kernel issues 24 vdpbf16ps on four B loads and six A pairs; the
// fma kernels 48 FMAs on eight B loads and twelve A values.
//
// The dot kernel reads the VNNI-2 panel as it is. The fma kernels first widen it, 128 k at a
// time, to a row-major fp32 panel on the stack (32 KB, L1-resident), and each 6-row block of A
// to fp32: both are exact, cost O(K·64 + M·K) against the product's O(M·K·64), and leave the
// inner loop nothing but loads and FMAs.
#include "gemm_avx512_16bit.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "avx512_intrinsics.h"

#if FLASHATTN_HAVE_AVX512_KERNELS
#include <cpuid.h>
#endif

namespace flashattn::cpu::avx512 {

void pack_vnni2(const uint16_t* in, int64_t ld_in, int64_t rows, int64_t cols, uint16_t* out,
                int64_t ldb) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    uint16_t* pair = out + p * 2 * ldb;
    const uint16_t* even = in + 2 * p * ld_in;
    const uint16_t* odd = 2 * p + 1 < rows ? even + ld_in : nullptr;
    for (int64_t n = 0; n < cols; ++n) {
      pair[2 * n] = even[n];
      pair[2 * n + 1] = odd ? odd[n] : uint16_t(0);
    }
  }
}

#if FLASHATTN_HAVE_AVX512_KERNELS

namespace {

struct Features {
  bool avx512 = false, avx512_bf16 = false, avx512_fp16 = false;
};

Features detect() {
  Features f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return f;  // OSXSAVE
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  // XMM, YMM, opmask, ZMM0-15 upper halves, ZMM16-31: all saved by the OS.
  if ((xcr0_lo & 0xE6) != 0xE6) return f;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool f_ = ebx & (1u << 16), dq = ebx & (1u << 17), bw = ebx & (1u << 30),
             vl = ebx & (1u << 31);
  f.avx512 = f_ && dq && bw && vl;
  f.avx512_fp16 = f.avx512 && (edx & (1u << 23));
  const unsigned max_subleaf = eax;
  if (f.avx512 && max_subleaf >= 1) {
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    f.avx512_bf16 = eax & (1u << 5);
  }
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

constexpr int kRowBlock = 6;
constexpr int kColBlock = 64;  // four zmm of fp32
constexpr int kDepthBlock = 128;  // k per widened fp32 B panel (even)

int32_t load_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// ---- vdpbf16ps ----------------------------------------------------------------------------

// The accumulators of a kRows x cols block of C (cols <= 16·kVecs, > 16·(kVecs-1)): `last`
// masks the lanes of the last vector that are columns.
template <int kRows, int kVecs>
FA_AVX512 FA_INLINE void load_accumulators(__m512 (&acc)[kRows][kVecs], const float* C,
                                           int64_t ldc, bool accumulate, __mmask16 last) {
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      const __mmask16 m = v == kVecs - 1 ? last : __mmask16(0xFFFF);
      acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(m, C + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
}
template <int kRows, int kVecs>
FA_AVX512 FA_INLINE void store_accumulators(const __m512 (&acc)[kRows][kVecs], float* C,
                                            int64_t ldc, __mmask16 last) {
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v)
      _mm512_mask_storeu_ps(C + r * ldc + 16 * v, v == kVecs - 1 ? last : __mmask16(0xFFFF),
                            acc[r][v]);
}

// C[kRows][cols] (+)= A[kRows][K] · B, B's columns [0, cols) (cols <= 16·kVecs, > 16·(kVecs-1)).
template <int kRows, int kVecs>
FA_AVX512_BF16 void dot_block(int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B,
                              int64_t ldb, float* C, int64_t ldc, bool accumulate, int64_t cols) {
  const __mmask16 last = lanes16(cols - 16 * (kVecs - 1));
  __m512 acc[kRows][kVecs];
  load_accumulators(acc, C, ldc, accumulate, last);
  const int64_t pairs = K / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* b = B + p * 2 * ldb;
    __m512i bv[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v)
      bv[v] = v == kVecs - 1 ? _mm512_maskz_loadu_epi32(last, b + 32 * v)
                             : _mm512_loadu_si512(b + 32 * v);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512i a = _mm512_set1_epi32(load_pair(A + r * lda + 2 * p));
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)bv[v]);
    }
  }
  if (K % 2) {  // the last k alone: A's pair is (A[r][K-1], 0), B's odd row is zero
    const uint16_t* b = B + pairs * 2 * ldb;
    __m512i bv[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v)
      bv[v] = _mm512_maskz_loadu_epi32(v == kVecs - 1 ? last : __mmask16(0xFFFF), b + 32 * v);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512i a = _mm512_set1_epi32(int32_t(A[r * lda + K - 1]));
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)bv[v]);
    }
  }
  store_accumulators(acc, C, ldc, last);
}

template <int kRows>
FA_AVX512_BF16 void dot_rows(int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B,
                             int64_t ldb, float* C, int64_t ldc, bool accumulate, int64_t cols) {
  switch ((cols + 15) / 16) {
    case 1: return dot_block<kRows, 1>(K, A, lda, B, ldb, C, ldc, accumulate, cols);
    case 2: return dot_block<kRows, 2>(K, A, lda, B, ldb, C, ldc, accumulate, cols);
    case 3: return dot_block<kRows, 3>(K, A, lda, B, ldb, C, ldc, accumulate, cols);
    default: return dot_block<kRows, 4>(K, A, lda, B, ldb, C, ldc, accumulate, cols);
  }
}

using DotRows = void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*,
                         int64_t, bool, int64_t);
constexpr DotRows kDotRows[kRowBlock + 1] = {nullptr,      dot_rows<1>, dot_rows<2>, dot_rows<3>,
                                             dot_rows<4>, dot_rows<5>, dot_rows<6>};

// ---- widen to fp32, then FMA ----------------------------------------------------------------

// 16 bf16 / fp16 values (raw bits) to fp32, exactly.
template <bool kHalf>
FA_AVX512 FA_INLINE __m512 widen16(__m256i bits) {
  if constexpr (kHalf) return _mm512_cvtph_ps(bits);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The even rows (low halves) and odd rows (high halves) of 16 VNNI-2 lanes, as fp32.
template <bool kHalf>
FA_AVX512 FA_INLINE void widen_pairs(__m512i pairs, __m512* even, __m512* odd) {
  if constexpr (kHalf) {
    *even = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pairs));
    *odd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
  } else {
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(int32_t(0xFFFF0000u))));
  }
}

// out[k][0..64) = fp32 of B's k rows [0, depth) (depth even or the last, odd, of K) and columns
// [0, cols); columns past cols are 0.
template <bool kHalf>
FA_AVX512 void widen_b(const uint16_t* B, int64_t ldb, int64_t depth, int64_t cols, float* out) {
  __mmask16 mask[kColBlock / 16];
  for (int v = 0; v < kColBlock / 16; ++v) mask[v] = lanes16(cols - 16 * v);
  for (int64_t p = 0; p < (depth + 1) / 2; ++p) {
    const uint16_t* b = B + p * 2 * ldb;
    float* even_row = out + 2 * p * kColBlock;
#pragma GCC unroll 4
    for (int v = 0; v < kColBlock / 16; ++v) {
      const __m512i pairs = _mm512_maskz_loadu_epi32(mask[v], b + 32 * v);
      __m512 even, odd;
      widen_pairs<kHalf>(pairs, &even, &odd);
      _mm512_storeu_ps(even_row + 16 * v, even);
      if (2 * p + 1 < depth) _mm512_storeu_ps(even_row + kColBlock + 16 * v, odd);
    }
  }
}

// out[r][0..depth) = fp32 of A[r][0..depth), rows [0, rows), row stride kDepthBlock.
template <bool kHalf>
FA_AVX512 void widen_a(const uint16_t* A, int64_t lda, int rows, int64_t depth, float* out) {
  const int64_t whole = depth / 16 * 16;
  const __mmask16 tail = lanes16(depth - whole);
  for (int r = 0; r < rows; ++r) {
    const uint16_t* a = A + r * lda;
    float* a32 = out + r * kDepthBlock;
    for (int64_t k = 0; k < whole; k += 16)
      _mm512_storeu_ps(a32 + k, widen16<kHalf>(_mm256_loadu_si256(
                                    reinterpret_cast<const __m256i*>(a + k))));
    if (tail)
      _mm512_storeu_ps(a32 + whole, widen16<kHalf>(_mm256_maskz_loadu_epi16(tail, a + whole)));
  }
}

// acc[r][v] += a[r][k] · b[k][16v ... 16v + 15] (a lambda would not inherit the target).
template <int kRows, int kVecs>
FA_AVX512 FA_INLINE void fma_step(__m512 (&acc)[kRows][kVecs], const float* a, const float* b,
                                  int64_t k) {
  __m512 bv[kVecs];
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) bv[v] = _mm512_loadu_ps(b + k * kColBlock + 16 * v);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m512 av = _mm512_set1_ps(a[r * kDepthBlock + k]);
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
  }
}

// C[kRows][cols] (+)= a[kRows][depth] (row stride kDepthBlock) · b[depth][64], all fp32.
template <int kRows, int kVecs>
FA_AVX512 void fma_block(int64_t depth, const float* a, const float* b, float* C, int64_t ldc,
                         bool accumulate, int64_t cols) {
  const __mmask16 last = lanes16(cols - 16 * (kVecs - 1));
  __m512 acc[kRows][kVecs];
  load_accumulators(acc, C, ldc, accumulate, last);
  // vdpbf16ps' order: in each pair, the odd k first.
  int64_t k = 0;
  for (; k + 1 < depth; k += 2) {
    fma_step<kRows, kVecs>(acc, a, b, k + 1);
    fma_step<kRows, kVecs>(acc, a, b, k);
  }
  if (k < depth) fma_step<kRows, kVecs>(acc, a, b, k);
  store_accumulators(acc, C, ldc, last);
}

template <int kRows>
FA_AVX512 void fma_rows(int64_t depth, const float* a, const float* b, float* C, int64_t ldc,
                        bool accumulate, int64_t cols) {
  switch ((cols + 15) / 16) {
    case 1: return fma_block<kRows, 1>(depth, a, b, C, ldc, accumulate, cols);
    case 2: return fma_block<kRows, 2>(depth, a, b, C, ldc, accumulate, cols);
    case 3: return fma_block<kRows, 3>(depth, a, b, C, ldc, accumulate, cols);
    default: return fma_block<kRows, 4>(depth, a, b, C, ldc, accumulate, cols);
  }
}

using FmaRows = void (*)(int64_t, const float*, const float*, float*, int64_t, bool, int64_t);
constexpr FmaRows kFmaRows[kRowBlock + 1] = {nullptr,      fma_rows<1>, fma_rows<2>, fma_rows<3>,
                                             fma_rows<4>, fma_rows<5>, fma_rows<6>};

template <bool kHalf>
FA_AVX512 void gemm_fma(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                        const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (K == 0) {
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m) std::fill_n(C + m * ldc, N, 0.f);
    return;
  }
  alignas(64) float b32[kDepthBlock * kColBlock];
  alignas(64) float a32[kRowBlock * kDepthBlock];
  for (int64_t n0 = 0; n0 < N; n0 += kColBlock) {
    const int64_t cols = std::min<int64_t>(kColBlock, N - n0);
    for (int64_t k0 = 0; k0 < K; k0 += kDepthBlock) {
      const int64_t depth = std::min<int64_t>(kDepthBlock, K - k0);
      widen_b<kHalf>(B + (k0 / 2) * 2 * ldb + 2 * n0, ldb, depth, cols, b32);
      const bool acc = accumulate || k0 > 0;
      for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
        const int rows = static_cast<int>(std::min<int64_t>(kRowBlock, M - m0));
        widen_a<kHalf>(A + m0 * lda + k0, lda, rows, depth, a32);
        kFmaRows[rows](depth, a32, b32, C + m0 * ldc + n0, ldc, acc, cols);
      }
    }
  }
}

using Gemm = void (*)(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*,
                     int64_t, float*, int64_t, bool);

// bf16 or fp16 bits to float, for normal numbers and zero (all the check below uses), in plain
// C++ so that nothing outside the kernels needs an ISA extension.
float to_float(uint16_t bits, bool half) {
  if (half) {
    const int exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
    const float magnitude = exponent == 0 ? 0.f : std::ldexp(1.f + mantissa / 1024.f, exponent - 15);
    return bits & 0x8000 ? -magnitude : magnitude;
  }
  const uint32_t wide = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

// Small integers (|value| < 1024), exactly: bf16 bits of the float, or fp16 bits.
uint16_t from_small_int(int value, bool half) {
  const float f = float(value);
  if (half) {
    if (value == 0) return 0;
    const int magnitude = std::abs(value);
    int exponent = 0;
    while ((magnitude >> (exponent + 1)) != 0) ++exponent;
    const int mantissa = ((magnitude << (10 - exponent)) & 0x3FF);
    return uint16_t((value < 0 ? 0x8000 : 0) | ((exponent + 15) << 10) | mantissa);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return uint16_t(bits >> 16);
}

// A 13 x 70 x 37 product (row, column and depth tails, odd K) of integers, accumulated onto
// integers, against plain loops.
bool multiplies_correctly(Gemm gemm, bool half) {
  constexpr int M = 13, N = 70, K = 37, ldb = 72;
  std::vector<uint16_t> a(M * K), b(K * N), packed(((K + 1) / 2) * 2 * ldb, 0xFFFF);
  std::vector<float> c(M * N), expected(M * N);
  for (int i = 0; i < M * K; ++i) a[i] = from_small_int(i * 7 % 5 - 2, half);
  for (int i = 0; i < K * N; ++i) b[i] = from_small_int(i * 3 % 7 - 3, half);
  for (int i = 0; i < M * N; ++i) c[i] = expected[i] = float(i % 11 - 5);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n)
        expected[m * N + n] += to_float(a[m * K + k], half) * to_float(b[k * N + n], half);
  pack_vnni2(b.data(), N, K, N, packed.data(), ldb);
  gemm(M, N, K, a.data(), K, packed.data(), ldb, c.data(), N, /*accumulate=*/true);
  return c == expected;
}

}  // namespace

bool cpu_has_avx512() { return features().avx512; }
bool cpu_has_avx512_bf16() { return features().avx512_bf16; }
bool cpu_has_avx512_fp16() { return features().avx512_fp16; }

bool bf16_dot_works() {
  static const bool works = cpu_has_avx512_bf16() && multiplies_correctly(gemm_bf16_dot, false);
  return works;
}
bool bf16_fma_works() {
  static const bool works = cpu_has_avx512() && multiplies_correctly(gemm_bf16_fma, false);
  return works;
}
bool fp16_fma_works() {
  static const bool works = cpu_has_avx512() && multiplies_correctly(gemm_fp16_fma, true);
  return works;
}

void gemm_bf16_dot(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (!cpu_has_avx512_bf16()) std::abort();  // never reached: callers check first
  if (K == 0) {
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m) std::fill_n(C + m * ldc, N, 0.f);
    return;
  }
  for (int64_t n0 = 0; n0 < N; n0 += kColBlock) {
    const int64_t cols = std::min<int64_t>(kColBlock, N - n0);
    for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowBlock, M - m0));
      kDotRows[rows](K, A + m0 * lda, lda, B + 2 * n0, ldb, C + m0 * ldc + n0, ldc, accumulate,
                     cols);
    }
  }
}

void gemm_bf16_fma(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (!cpu_has_avx512()) std::abort();
  gemm_fma<false>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

void gemm_fp16_fma(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (!cpu_has_avx512()) std::abort();
  gemm_fma<true>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

#else  // not x86-64 with GCC/Clang: no AVX-512 kernels

bool cpu_has_avx512() { return false; }
bool cpu_has_avx512_bf16() { return false; }
bool cpu_has_avx512_fp16() { return false; }
bool bf16_dot_works() { return false; }
bool bf16_fma_works() { return false; }
bool fp16_fma_works() { return false; }
void gemm_bf16_dot(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                   float*, int64_t, bool) { std::abort(); }
void gemm_bf16_fma(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                   float*, int64_t, bool) { std::abort(); }
void gemm_fp16_fma(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                   float*, int64_t, bool) { std::abort(); }

#endif

}  // namespace flashattn::cpu::avx512
