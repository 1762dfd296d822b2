// Hopper's warpgroup MMA (wgmma) and its companions: shared-memory matrix descriptors,
// wgmma.mma_async m64nNk16 (f16/bf16 into f32, A from shared memory or registers) and
// m64nNk32 (e4m3 into f32, likewise),
// wgmma.fence/commit_group/wait_group, setmaxnreg, fence.proxy.async and stmatrix.
// Included by ptx.cuh (for the shim and sm_90+ device passes); include ptx.cuh, not this file.
// Under the shim each wrapper calls cudasim's emulation (tests/cudasim/src/wgmma.cpp; README.md,
// "wgmma"); under nvcc it is inline PTX that needs -gencode arch=compute_90a,code=sm_90a (a
// plain sm_90 pass compiles the header, and fails a static_assert where a kernel calls wgmma or
// setmaxnreg).
//
// Layouts, in the PTX ISA's terms ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
// - The accumulator D (m64nN, f32) of a warpgroup: warp w (0-3 within the warpgroup) holds rows
//   16w..16w+15 in the m16n8 D-fragment layout of mma.sync, repeated over the N/8 column blocks.
//   With groupID = laneid / 4 and threadID_in_group = laneid % 4, thread element d[i]
//   (0 <= i < N/2) is D[16w + groupID + 8 * ((i % 4) / 2)][8 * (i / 4) + 2 * threadID_in_group
//   + i % 2].
// - A in registers (m64k16, four .b32 holding two f16/bf16 each, low half first): warp w holds
//   rows 16w..16w+15 as mma.m16n8k16's A fragment: a[0] = A[16w+g][2t..2t+1], a[1] =
//   A[16w+g+8][2t..], a[2] = A[16w+g][2t+8..2t+9], a[3] = A[16w+g+8][2t+8..] (g = groupID,
//   t = threadID_in_group).
// - A in registers, e4m3 (m64k32, four .b32 holding four e4m3 each, lowest byte first): as
//   mma.m16n8k32's 8-bit A fragment: a[0] = A[16w+g][4t..4t+3], a[1] = A[16w+g+8][4t..],
//   a[2] = A[16w+g][4t+16..4t+19], a[3] = A[16w+g+8][4t+16..].
// - A and B in shared memory: a 64-bit matrix descriptor (wgmma_descriptor below) and the
//   imm-trans immediate: K-major (0; A is M x K and B is N x K with K contiguous) or MN-major
//   (1). The canonical layouts, for 16-bit elements, T = 8 elements per 16-byte chunk, with
//   element (r, k) at row r of M or N and column k of K:
//     K-major, no swizzle: 8 x 16-byte "core matrices" of 8 rows, rows 16 bytes apart; k / 8
//       selects the core matrix at + LBO, r / 8 the one at + SBO.
//     K-major, 32/64/128-byte swizzle (S): row r at (r % 8) * S + (r / 8) * SBO, column k at
//       2k bytes within the row; LBO is unused. Step K by 16 by adding 32 bytes to the start.
//     MN-major, no swizzle: 8 MN-contiguous elements per 16-byte row, the 8 rows of a core
//       matrix are 8 consecutive k; r / 8 steps by SBO, k / 8 by LBO.
//     MN-major, swizzled: S / 2 MN-contiguous elements per S-byte row, row k % 8 at (k % 8) * S;
//       r / (S / 2) steps by LBO, k / 8 by SBO.
//   8-bit (e4m3) operands are K-major only (the ISA's FP8 forms take no imm-trans: FA3
//   transposes V in shared memory for P * V), with the same 16-byte core-matrix rows holding
//   16 elements: no swizzle, k / 16 selects the core matrix at + LBO; swizzled, column k at k
//   bytes. A K step of 32 (one instruction) is 32 bytes, as 16 steps of a 16-bit type are.
//   The swizzle XORs address bits [4, 4+b) with bits [7, 7+b) (b = 1, 2, 3 for 32, 64, 128
//   bytes) of the shared-memory address, so swizzled tiles start 256/512/1024-byte aligned
//   (tests/cudasim/src/swizzle.h spells the rule once for TMA and wgmma).
#pragma once
#include <cstdint>

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
#define FLASHATTN_SM90_MMA_SHIM 1
#include "src/wgmma.h"
#include "src/async_proxy.h"
#define FLASHATTN_SM90_HD constexpr inline
#else
#define FLASHATTN_SM90_MMA_SHIM 0
#define FLASHATTN_SM90_HD __host__ __device__ constexpr inline
#endif

namespace flashattn {
namespace ptx {

// The descriptor's layout type (bits 62-63): how the tile's 16-byte chunks are swizzled.
enum class WgmmaSwizzle : uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };
// The imm-trans-a / imm-trans-b immediates: K-major (0) or M-/N-major (1).
enum class WgmmaMajor : int { K = 0, MN = 1 };

// A shared-memory matrix descriptor ("Matrix Descriptor Format"): bits 0-13 the start address,
// 16-29 the leading dimension byte offset (LBO), 32-45 the stride dimension byte offset (SBO),
// each as (x & 0x3FFFF) >> 4; bits 49-51 the base offset (0: swizzled tiles start on their
// pattern's boundary, which these wrappers require); bits 62-63 the swizzle. smem_addr is
// smem_u32addr() of the tile's first byte.
FLASHATTN_SM90_HD uint64_t wgmma_descriptor(uint32_t smem_addr, uint32_t leading_byte_offset,
                                            uint32_t stride_byte_offset, WgmmaSwizzle swizzle) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         static_cast<uint64_t>((leading_byte_offset & 0x3FFFFu) >> 4) << 16 |
         static_cast<uint64_t>((stride_byte_offset & 0x3FFFFu) >> 4) << 32 |
         static_cast<uint64_t>(swizzle) << 62;
}
// The same descriptor with its start address moved by `bytes` (a multiple of 16 that keeps the
// address below 256 KB): the next K step of a K-major tile, the next tile of a ring.
FLASHATTN_SM90_HD uint64_t wgmma_descriptor_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}
// The same advance written on the low 32 bits only: the start address (bits 0-13) stays below
// 256 KB, and the low word (start address and LBO) below 2^30, so the sum never carries into the
// high word, and the value is wgmma_descriptor_advance's. Written so, every descriptor a loop
// derives from one base shares that base's high word instead of holding a 64-bit sum each; from
// a warp-uniform base, ptxas then keeps the d = 256 attn_mask forward's 16 Q descriptors in
// uniform registers (docs/lab/2026-12-04-hopper-feature-combinations-5.md).
FLASHATTN_SM90_HD uint64_t wgmma_descriptor_advance_low(uint64_t desc, uint32_t bytes) {
  const uint32_t low = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | low;
}

#if FLASHATTN_SM90_MMA_SHIM

// ---- Under the shim ----

template <int N>
constexpr bool wgmma_valid_n() { return N >= 8 && N <= 256 && N % 8 == 0; }

// D[64 x N] = A[64 x 16] * B[16 x N] + (scale_d ? D : 0), A and B from descriptors. d holds
// this thread's N/2 accumulators (layout above); they read as NaN until the wgmma.wait_group
// that retires the commit group holding this MMA.
template <int N, WgmmaMajor kMajorA = WgmmaMajor::K, WgmmaMajor kMajorB = WgmmaMajor::K>
FLASHATTN_PTX_DEVICE void wgmma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                        int scale_d FLASHATTN_PTX_SITE) {
  static_assert(wgmma_valid_n<N>(), "wgmma m64nNk16: N is 8 to 256, a multiple of 8");
  ::cudasim::detail::wgmma_mma_async({N, ::cudasim::detail::WgmmaInput::BF16, static_cast<int>(kMajorA),
                                      static_cast<int>(kMajorB)},
                                     d, nullptr, desc_a, desc_b, scale_d, file, line);
}
template <int N, WgmmaMajor kMajorA = WgmmaMajor::K, WgmmaMajor kMajorB = WgmmaMajor::K>
FLASHATTN_PTX_DEVICE void wgmma_f16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                       int scale_d FLASHATTN_PTX_SITE) {
  static_assert(wgmma_valid_n<N>(), "wgmma m64nNk16: N is 8 to 256, a multiple of 8");
  ::cudasim::detail::wgmma_mma_async({N, ::cudasim::detail::WgmmaInput::F16, static_cast<int>(kMajorA),
                                      static_cast<int>(kMajorB)},
                                     d, nullptr, desc_a, desc_b, scale_d, file, line);
}
// The same with A from registers: a is this thread's m64k16 A fragment (layout above).
template <int N, WgmmaMajor kMajorB = WgmmaMajor::K>
FLASHATTN_PTX_DEVICE void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                        int scale_d FLASHATTN_PTX_SITE) {
  static_assert(wgmma_valid_n<N>(), "wgmma m64nNk16: N is 8 to 256, a multiple of 8");
  ::cudasim::detail::wgmma_mma_async({N, ::cudasim::detail::WgmmaInput::BF16, 0, static_cast<int>(kMajorB)},
                                     d, a, 0, desc_b, scale_d, file, line);
}
template <int N, WgmmaMajor kMajorB = WgmmaMajor::K>
FLASHATTN_PTX_DEVICE void wgmma_f16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                       int scale_d FLASHATTN_PTX_SITE) {
  static_assert(wgmma_valid_n<N>(), "wgmma m64nNk16: N is 8 to 256, a multiple of 8");
  ::cudasim::detail::wgmma_mma_async({N, ::cudasim::detail::WgmmaInput::F16, 0, static_cast<int>(kMajorB)},
                                     d, a, 0, desc_b, scale_d, file, line);
}
// D[64 x N] = A[64 x 32] * B[32 x N] + (scale_d ? D : 0) on e4m3 inputs, f32 accumulators
// (m64nNk32.f32.e4m3.e4m3), A and B from K-major descriptors; one instruction consumes K = 32,
// 32 bytes of each row. Hardware does not sum e4m3 products as IEEE f32 in general (the shim
// does: exact products, one rounding); inputs whose partial sums are exact agree bit for bit.
template <int N>
FLASHATTN_PTX_DEVICE void wgmma_e4m3_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                        int scale_d FLASHATTN_PTX_SITE) {
  static_assert(wgmma_valid_n<N>(), "wgmma m64nNk32: N is 8 to 256, a multiple of 8");
  ::cudasim::detail::wgmma_mma_async({N, ::cudasim::detail::WgmmaInput::E4M3, 0, 0}, d, nullptr,
                                     desc_a, desc_b, scale_d, file, line);
}
// The same with A from registers: a is this thread's m64k32 e4m3 A fragment (layout above).
template <int N>
FLASHATTN_PTX_DEVICE void wgmma_e4m3_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                        int scale_d FLASHATTN_PTX_SITE) {
  static_assert(wgmma_valid_n<N>(), "wgmma m64nNk32: N is 8 to 256, a multiple of 8");
  ::cudasim::detail::wgmma_mma_async({N, ::cudasim::detail::WgmmaInput::E4M3, 0, 0}, d, a, 0,
                                     desc_b, scale_d, file, line);
}

FLASHATTN_PTX_DEVICE void wgmma_fence(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::wgmma_fence(file, line);
}
FLASHATTN_PTX_DEVICE void wgmma_commit_group(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::wgmma_commit_group(file, line);
}
template <int N>
FLASHATTN_PTX_DEVICE void wgmma_wait_group(FLASHATTN_PTX_SITE_ONLY) {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group N: 0 to 7");
  ::cudasim::detail::wgmma_wait_group(N, file, line);
}
// Keeps the compiler from moving register accesses to an accumulator across the wgmma
// instructions (nvcc); nothing to do under the shim.
template <int K>
FLASHATTN_PTX_DEVICE void wgmma_fence_operand(float (&)[K]) {}
template <int K>
FLASHATTN_PTX_DEVICE void wgmma_fence_operand(uint32_t (&)[K]) {}

template <int kRegisters>
FLASHATTN_PTX_DEVICE void setmaxnreg_inc(FLASHATTN_PTX_SITE_ONLY) {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0,
                "setmaxnreg: 24 to 256, a multiple of 8");
  ::cudasim::detail::setmaxnreg(true, kRegisters, file, line);
}
template <int kRegisters>
FLASHATTN_PTX_DEVICE void setmaxnreg_dec(FLASHATTN_PTX_SITE_ONLY) {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0,
                "setmaxnreg: 24 to 256, a multiple of 8");
  ::cudasim::detail::setmaxnreg(false, kRegisters, file, line);
}

FLASHATTN_PTX_DEVICE void fence_proxy_async_shared_cta(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::fence_proxy_async(file, line);
}

// stmatrix: lane 8m + r gives the address of row r of matrix m (16-byte aligned, in dynamic
// shared memory); register m of each lane is its fragment of matrix m, as ldmatrix returns it.
FLASHATTN_PTX_DEVICE void stmatrix_x1(void* smem_row, uint32_t r0 FLASHATTN_PTX_SITE) {
  const uint32_t r[1] = {r0};
  ::cudasim::detail::stmatrix(1, false, r, smem_row, file, line);
}
FLASHATTN_PTX_DEVICE void stmatrix_x2(void* smem_row, uint32_t r0, uint32_t r1 FLASHATTN_PTX_SITE) {
  const uint32_t r[2] = {r0, r1};
  ::cudasim::detail::stmatrix(2, false, r, smem_row, file, line);
}
FLASHATTN_PTX_DEVICE void stmatrix_x4(void* smem_row, uint32_t r0, uint32_t r1, uint32_t r2,
                                      uint32_t r3 FLASHATTN_PTX_SITE) {
  const uint32_t r[4] = {r0, r1, r2, r3};
  ::cudasim::detail::stmatrix(4, false, r, smem_row, file, line);
}
FLASHATTN_PTX_DEVICE void stmatrix_x1_trans(void* smem_row, uint32_t r0 FLASHATTN_PTX_SITE) {
  const uint32_t r[1] = {r0};
  ::cudasim::detail::stmatrix(1, true, r, smem_row, file, line);
}
FLASHATTN_PTX_DEVICE void stmatrix_x2_trans(void* smem_row, uint32_t r0, uint32_t r1 FLASHATTN_PTX_SITE) {
  const uint32_t r[2] = {r0, r1};
  ::cudasim::detail::stmatrix(2, true, r, smem_row, file, line);
}
FLASHATTN_PTX_DEVICE void stmatrix_x4_trans(void* smem_row, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3 FLASHATTN_PTX_SITE) {
  const uint32_t r[4] = {r0, r1, r2, r3};
  ::cudasim::detail::stmatrix(4, true, r, smem_row, file, line);
}

#else  // nvcc

namespace detail {

// wgmma and setmaxnreg exist only in arch-specific sm_90a code: nvcc defines
// __CUDA_ARCH_FEAT_SM90_ALL in a compute_90a device pass, and not in a plain sm_90 (or sm_100)
// one, whose ptxas rejects them. There every wrapper below that emits them fails to compile
// where a kernel instantiates it (a static_assert on a template-dependent false), so a plain
// sm_90 build of code that only includes this header still compiles. The host pass sees them
// as before (it emits no device code).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_SM90A_PTX 0
#else
#define FLASHATTN_SM90A_PTX 1
#endif
template <int kDependent>
struct Sm90aPtx {
  static constexpr bool value = FLASHATTN_SM90A_PTX != 0;
};
#define FLASHATTN_REQUIRE_SM90A(dependent)                                                      \
  static_assert(::flashattn::ptx::detail::Sm90aPtx<(dependent)>::value,                         \
                "wgmma and setmaxnreg need an arch-specific sm_90a device pass: build with "    \
                "-gencode arch=compute_90a,code=sm_90a (this pass is plain sm_90 or another SM)")

// Inline PTX has no symbolic operands under nvcc, so each N spells its operand numbers: the
// N/2 accumulators are %0..%(N/2 - 1), the inputs follow. REGS_c is "%0, ..., %(c-1)".
#define FLASHATTN_WGMMA_REGS_4 "%0, %1, %2, %3"
#define FLASHATTN_WGMMA_REGS_8 FLASHATTN_WGMMA_REGS_4 ", " "%4, %5, %6, %7"
#define FLASHATTN_WGMMA_REGS_12 FLASHATTN_WGMMA_REGS_8 ", " "%8, %9, %10, %11"
#define FLASHATTN_WGMMA_REGS_16 FLASHATTN_WGMMA_REGS_12 ", " "%12, %13, %14, %15"
#define FLASHATTN_WGMMA_REGS_20 FLASHATTN_WGMMA_REGS_16 ", " "%16, %17, %18, %19"
#define FLASHATTN_WGMMA_REGS_24 FLASHATTN_WGMMA_REGS_20 ", " "%20, %21, %22, %23"
#define FLASHATTN_WGMMA_REGS_28 FLASHATTN_WGMMA_REGS_24 ", " "%24, %25, %26, %27"
#define FLASHATTN_WGMMA_REGS_32 FLASHATTN_WGMMA_REGS_28 ", " "%28, %29, %30, %31"
#define FLASHATTN_WGMMA_REGS_36 FLASHATTN_WGMMA_REGS_32 ", " "%32, %33, %34, %35"
#define FLASHATTN_WGMMA_REGS_40 FLASHATTN_WGMMA_REGS_36 ", " "%36, %37, %38, %39"
#define FLASHATTN_WGMMA_REGS_44 FLASHATTN_WGMMA_REGS_40 ", " "%40, %41, %42, %43"
#define FLASHATTN_WGMMA_REGS_48 FLASHATTN_WGMMA_REGS_44 ", " "%44, %45, %46, %47"
#define FLASHATTN_WGMMA_REGS_52 FLASHATTN_WGMMA_REGS_48 ", " "%48, %49, %50, %51"
#define FLASHATTN_WGMMA_REGS_56 FLASHATTN_WGMMA_REGS_52 ", " "%52, %53, %54, %55"
#define FLASHATTN_WGMMA_REGS_60 FLASHATTN_WGMMA_REGS_56 ", " "%56, %57, %58, %59"
#define FLASHATTN_WGMMA_REGS_64 FLASHATTN_WGMMA_REGS_60 ", " "%60, %61, %62, %63"
#define FLASHATTN_WGMMA_REGS_68 FLASHATTN_WGMMA_REGS_64 ", " "%64, %65, %66, %67"
#define FLASHATTN_WGMMA_REGS_72 FLASHATTN_WGMMA_REGS_68 ", " "%68, %69, %70, %71"
#define FLASHATTN_WGMMA_REGS_76 FLASHATTN_WGMMA_REGS_72 ", " "%72, %73, %74, %75"
#define FLASHATTN_WGMMA_REGS_80 FLASHATTN_WGMMA_REGS_76 ", " "%76, %77, %78, %79"
#define FLASHATTN_WGMMA_REGS_84 FLASHATTN_WGMMA_REGS_80 ", " "%80, %81, %82, %83"
#define FLASHATTN_WGMMA_REGS_88 FLASHATTN_WGMMA_REGS_84 ", " "%84, %85, %86, %87"
#define FLASHATTN_WGMMA_REGS_92 FLASHATTN_WGMMA_REGS_88 ", " "%88, %89, %90, %91"
#define FLASHATTN_WGMMA_REGS_96 FLASHATTN_WGMMA_REGS_92 ", " "%92, %93, %94, %95"
#define FLASHATTN_WGMMA_REGS_100 FLASHATTN_WGMMA_REGS_96 ", " "%96, %97, %98, %99"
#define FLASHATTN_WGMMA_REGS_104 FLASHATTN_WGMMA_REGS_100 ", " "%100, %101, %102, %103"
#define FLASHATTN_WGMMA_REGS_108 FLASHATTN_WGMMA_REGS_104 ", " "%104, %105, %106, %107"
#define FLASHATTN_WGMMA_REGS_112 FLASHATTN_WGMMA_REGS_108 ", " "%108, %109, %110, %111"
#define FLASHATTN_WGMMA_REGS_116 FLASHATTN_WGMMA_REGS_112 ", " "%112, %113, %114, %115"
#define FLASHATTN_WGMMA_REGS_120 FLASHATTN_WGMMA_REGS_116 ", " "%116, %117, %118, %119"
#define FLASHATTN_WGMMA_REGS_124 FLASHATTN_WGMMA_REGS_120 ", " "%120, %121, %122, %123"
#define FLASHATTN_WGMMA_REGS_128 FLASHATTN_WGMMA_REGS_124 ", " "%124, %125, %126, %127"
#define FLASHATTN_WGMMA_OPS_4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define FLASHATTN_WGMMA_OPS_8 FLASHATTN_WGMMA_OPS_4, "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define FLASHATTN_WGMMA_OPS_12 FLASHATTN_WGMMA_OPS_8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
#define FLASHATTN_WGMMA_OPS_16 FLASHATTN_WGMMA_OPS_12, "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define FLASHATTN_WGMMA_OPS_20 FLASHATTN_WGMMA_OPS_16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
#define FLASHATTN_WGMMA_OPS_24 FLASHATTN_WGMMA_OPS_20, "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define FLASHATTN_WGMMA_OPS_28 FLASHATTN_WGMMA_OPS_24, "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
#define FLASHATTN_WGMMA_OPS_32 FLASHATTN_WGMMA_OPS_28, "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FLASHATTN_WGMMA_OPS_36 FLASHATTN_WGMMA_OPS_32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
#define FLASHATTN_WGMMA_OPS_40 FLASHATTN_WGMMA_OPS_36, "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define FLASHATTN_WGMMA_OPS_44 FLASHATTN_WGMMA_OPS_40, "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43])
#define FLASHATTN_WGMMA_OPS_48 FLASHATTN_WGMMA_OPS_44, "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define FLASHATTN_WGMMA_OPS_52 FLASHATTN_WGMMA_OPS_48, "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51])
#define FLASHATTN_WGMMA_OPS_56 FLASHATTN_WGMMA_OPS_52, "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
#define FLASHATTN_WGMMA_OPS_60 FLASHATTN_WGMMA_OPS_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59])
#define FLASHATTN_WGMMA_OPS_64 FLASHATTN_WGMMA_OPS_60, "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FLASHATTN_WGMMA_OPS_68 FLASHATTN_WGMMA_OPS_64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
#define FLASHATTN_WGMMA_OPS_72 FLASHATTN_WGMMA_OPS_68, "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
#define FLASHATTN_WGMMA_OPS_76 FLASHATTN_WGMMA_OPS_72, "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75])
#define FLASHATTN_WGMMA_OPS_80 FLASHATTN_WGMMA_OPS_76, "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#define FLASHATTN_WGMMA_OPS_84 FLASHATTN_WGMMA_OPS_80, "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83])
#define FLASHATTN_WGMMA_OPS_88 FLASHATTN_WGMMA_OPS_84, "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#define FLASHATTN_WGMMA_OPS_92 FLASHATTN_WGMMA_OPS_88, "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91])
#define FLASHATTN_WGMMA_OPS_96 FLASHATTN_WGMMA_OPS_92, "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define FLASHATTN_WGMMA_OPS_100 FLASHATTN_WGMMA_OPS_96, "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99])
#define FLASHATTN_WGMMA_OPS_104 FLASHATTN_WGMMA_OPS_100, "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])
#define FLASHATTN_WGMMA_OPS_108 FLASHATTN_WGMMA_OPS_104, "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107])
#define FLASHATTN_WGMMA_OPS_112 FLASHATTN_WGMMA_OPS_108, "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
#define FLASHATTN_WGMMA_OPS_116 FLASHATTN_WGMMA_OPS_112, "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115])
#define FLASHATTN_WGMMA_OPS_120 FLASHATTN_WGMMA_OPS_116, "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119])
#define FLASHATTN_WGMMA_OPS_124 FLASHATTN_WGMMA_OPS_120, "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123])
#define FLASHATTN_WGMMA_OPS_128 FLASHATTN_WGMMA_OPS_124, "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

template <int N>
struct WgmmaAsm;

// C = N/2 accumulators; P0..P6 are "%C" .. "%(C+6)", the operand numbers of the inputs.
#define FLASHATTN_WGMMA_BODY_SS(N, C, TYPE, P0, P1, P2, P3, P4)                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P2 ", 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" FLASHATTN_WGMMA_REGS_##C \
               "}, " P0 ", " P1 ", p, 1, 1, " P3 ", " P4 ";\n}\n"                                   \
               : FLASHATTN_WGMMA_OPS_##C                                                            \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB))
#define FLASHATTN_WGMMA_BODY_RS(N, C, TYPE, P0, P1, P2, P3, P4, P5, P6)                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P5 ", 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" FLASHATTN_WGMMA_REGS_##C \
               "}, {" P0 ", " P1 ", " P2 ", " P3 "}, " P4 ", p, 1, 1, " P6 ";\n}\n"                 \
               : FLASHATTN_WGMMA_OPS_##C                                                            \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d),             \
                 "n"(kTransB))
// e4m3 (m64nNk32): no imm-trans operands; P0..P2 = desc_a, desc_b, scale_d (SS) and
// P0..P5 = a[0..3], desc_b, scale_d (RS).
#define FLASHATTN_WGMMA_BODY_SS_E4M3(N, C, P0, P1, P2)                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P2 ", 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" FLASHATTN_WGMMA_REGS_##C  \
               "}, " P0 ", " P1 ", p, 1, 1;\n}\n"                                                   \
               : FLASHATTN_WGMMA_OPS_##C                                                            \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define FLASHATTN_WGMMA_BODY_RS_E4M3(N, C, P0, P1, P2, P3, P4, P5)                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P5 ", 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" FLASHATTN_WGMMA_REGS_##C  \
               "}, {" P0 ", " P1 ", " P2 ", " P3 "}, " P4 ", p, 1, 1;\n}\n"                         \
               : FLASHATTN_WGMMA_OPS_##C                                                            \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
#define FLASHATTN_WGMMA_SHAPE(N, C, P0, P1, P2, P3, P4, P5, P6)                                     \
  template <>                                                                                       \
  struct WgmmaAsm<N> {                                                                              \
    template <int kTransA, int kTransB>                                                             \
    static __device__ __forceinline__ void ss_bf16(float (&d)[N / 2], uint64_t desc_a,              \
                                                   uint64_t desc_b, int scale_d) {                  \
      FLASHATTN_WGMMA_BODY_SS(N, C, "bf16", P0, P1, P2, P3, P4);                                    \
    }                                                                                               \
    template <int kTransA, int kTransB>                                                             \
    static __device__ __forceinline__ void ss_f16(float (&d)[N / 2], uint64_t desc_a,               \
                                                  uint64_t desc_b, int scale_d) {                   \
      FLASHATTN_WGMMA_BODY_SS(N, C, "f16", P0, P1, P2, P3, P4);                                     \
    }                                                                                               \
    template <int kTransB>                                                                          \
    static __device__ __forceinline__ void rs_bf16(float (&d)[N / 2], const uint32_t (&a)[4],       \
                                                   uint64_t desc_b, int scale_d) {                  \
      FLASHATTN_WGMMA_BODY_RS(N, C, "bf16", P0, P1, P2, P3, P4, P5, P6);                            \
    }                                                                                               \
    template <int kTransB>                                                                          \
    static __device__ __forceinline__ void rs_f16(float (&d)[N / 2], const uint32_t (&a)[4],        \
                                                  uint64_t desc_b, int scale_d) {                   \
      FLASHATTN_WGMMA_BODY_RS(N, C, "f16", P0, P1, P2, P3, P4, P5, P6);                             \
    }                                                                                               \
    static __device__ __forceinline__ void ss_e4m3(float (&d)[N / 2], uint64_t desc_a,              \
                                                   uint64_t desc_b, int scale_d) {                  \
      FLASHATTN_WGMMA_BODY_SS_E4M3(N, C, P0, P1, P2);                                               \
    }                                                                                               \
    static __device__ __forceinline__ void rs_e4m3(float (&d)[N / 2], const uint32_t (&a)[4],       \
                                                   uint64_t desc_b, int scale_d) {                  \
      FLASHATTN_WGMMA_BODY_RS_E4M3(N, C, P0, P1, P2, P3, P4, P5);                                   \
    }                                                                                               \
  };

FLASHATTN_WGMMA_SHAPE(8, 4, "%4", "%5", "%6", "%7", "%8", "%9", "%10")
FLASHATTN_WGMMA_SHAPE(16, 8, "%8", "%9", "%10", "%11", "%12", "%13", "%14")
FLASHATTN_WGMMA_SHAPE(24, 12, "%12", "%13", "%14", "%15", "%16", "%17", "%18")
FLASHATTN_WGMMA_SHAPE(32, 16, "%16", "%17", "%18", "%19", "%20", "%21", "%22")
FLASHATTN_WGMMA_SHAPE(40, 20, "%20", "%21", "%22", "%23", "%24", "%25", "%26")
FLASHATTN_WGMMA_SHAPE(48, 24, "%24", "%25", "%26", "%27", "%28", "%29", "%30")
FLASHATTN_WGMMA_SHAPE(56, 28, "%28", "%29", "%30", "%31", "%32", "%33", "%34")
FLASHATTN_WGMMA_SHAPE(64, 32, "%32", "%33", "%34", "%35", "%36", "%37", "%38")
FLASHATTN_WGMMA_SHAPE(72, 36, "%36", "%37", "%38", "%39", "%40", "%41", "%42")
FLASHATTN_WGMMA_SHAPE(80, 40, "%40", "%41", "%42", "%43", "%44", "%45", "%46")
FLASHATTN_WGMMA_SHAPE(88, 44, "%44", "%45", "%46", "%47", "%48", "%49", "%50")
FLASHATTN_WGMMA_SHAPE(96, 48, "%48", "%49", "%50", "%51", "%52", "%53", "%54")
FLASHATTN_WGMMA_SHAPE(104, 52, "%52", "%53", "%54", "%55", "%56", "%57", "%58")
FLASHATTN_WGMMA_SHAPE(112, 56, "%56", "%57", "%58", "%59", "%60", "%61", "%62")
FLASHATTN_WGMMA_SHAPE(120, 60, "%60", "%61", "%62", "%63", "%64", "%65", "%66")
FLASHATTN_WGMMA_SHAPE(128, 64, "%64", "%65", "%66", "%67", "%68", "%69", "%70")
FLASHATTN_WGMMA_SHAPE(136, 68, "%68", "%69", "%70", "%71", "%72", "%73", "%74")
FLASHATTN_WGMMA_SHAPE(144, 72, "%72", "%73", "%74", "%75", "%76", "%77", "%78")
FLASHATTN_WGMMA_SHAPE(152, 76, "%76", "%77", "%78", "%79", "%80", "%81", "%82")
FLASHATTN_WGMMA_SHAPE(160, 80, "%80", "%81", "%82", "%83", "%84", "%85", "%86")
FLASHATTN_WGMMA_SHAPE(168, 84, "%84", "%85", "%86", "%87", "%88", "%89", "%90")
FLASHATTN_WGMMA_SHAPE(176, 88, "%88", "%89", "%90", "%91", "%92", "%93", "%94")
FLASHATTN_WGMMA_SHAPE(184, 92, "%92", "%93", "%94", "%95", "%96", "%97", "%98")
FLASHATTN_WGMMA_SHAPE(192, 96, "%96", "%97", "%98", "%99", "%100", "%101", "%102")
FLASHATTN_WGMMA_SHAPE(200, 100, "%100", "%101", "%102", "%103", "%104", "%105", "%106")
FLASHATTN_WGMMA_SHAPE(208, 104, "%104", "%105", "%106", "%107", "%108", "%109", "%110")
FLASHATTN_WGMMA_SHAPE(216, 108, "%108", "%109", "%110", "%111", "%112", "%113", "%114")
FLASHATTN_WGMMA_SHAPE(224, 112, "%112", "%113", "%114", "%115", "%116", "%117", "%118")
FLASHATTN_WGMMA_SHAPE(232, 116, "%116", "%117", "%118", "%119", "%120", "%121", "%122")
FLASHATTN_WGMMA_SHAPE(240, 120, "%120", "%121", "%122", "%123", "%124", "%125", "%126")
FLASHATTN_WGMMA_SHAPE(248, 124, "%124", "%125", "%126", "%127", "%128", "%129", "%130")
FLASHATTN_WGMMA_SHAPE(256, 128, "%128", "%129", "%130", "%131", "%132", "%133", "%134")

#undef FLASHATTN_WGMMA_SHAPE
#undef FLASHATTN_WGMMA_REGS_4
#undef FLASHATTN_WGMMA_REGS_8
#undef FLASHATTN_WGMMA_REGS_12
#undef FLASHATTN_WGMMA_REGS_16
#undef FLASHATTN_WGMMA_REGS_20
#undef FLASHATTN_WGMMA_REGS_24
#undef FLASHATTN_WGMMA_REGS_28
#undef FLASHATTN_WGMMA_REGS_32
#undef FLASHATTN_WGMMA_REGS_36
#undef FLASHATTN_WGMMA_REGS_40
#undef FLASHATTN_WGMMA_REGS_44
#undef FLASHATTN_WGMMA_REGS_48
#undef FLASHATTN_WGMMA_REGS_52
#undef FLASHATTN_WGMMA_REGS_56
#undef FLASHATTN_WGMMA_REGS_60
#undef FLASHATTN_WGMMA_REGS_64
#undef FLASHATTN_WGMMA_REGS_68
#undef FLASHATTN_WGMMA_REGS_72
#undef FLASHATTN_WGMMA_REGS_76
#undef FLASHATTN_WGMMA_REGS_80
#undef FLASHATTN_WGMMA_REGS_84
#undef FLASHATTN_WGMMA_REGS_88
#undef FLASHATTN_WGMMA_REGS_92
#undef FLASHATTN_WGMMA_REGS_96
#undef FLASHATTN_WGMMA_REGS_100
#undef FLASHATTN_WGMMA_REGS_104
#undef FLASHATTN_WGMMA_REGS_108
#undef FLASHATTN_WGMMA_REGS_112
#undef FLASHATTN_WGMMA_REGS_116
#undef FLASHATTN_WGMMA_REGS_120
#undef FLASHATTN_WGMMA_REGS_124
#undef FLASHATTN_WGMMA_REGS_128
#undef FLASHATTN_WGMMA_OPS_4
#undef FLASHATTN_WGMMA_OPS_8
#undef FLASHATTN_WGMMA_OPS_12
#undef FLASHATTN_WGMMA_OPS_16
#undef FLASHATTN_WGMMA_OPS_20
#undef FLASHATTN_WGMMA_OPS_24
#undef FLASHATTN_WGMMA_OPS_28
#undef FLASHATTN_WGMMA_OPS_32
#undef FLASHATTN_WGMMA_OPS_36
#undef FLASHATTN_WGMMA_OPS_40
#undef FLASHATTN_WGMMA_OPS_44
#undef FLASHATTN_WGMMA_OPS_48
#undef FLASHATTN_WGMMA_OPS_52
#undef FLASHATTN_WGMMA_OPS_56
#undef FLASHATTN_WGMMA_OPS_60
#undef FLASHATTN_WGMMA_OPS_64
#undef FLASHATTN_WGMMA_OPS_68
#undef FLASHATTN_WGMMA_OPS_72
#undef FLASHATTN_WGMMA_OPS_76
#undef FLASHATTN_WGMMA_OPS_80
#undef FLASHATTN_WGMMA_OPS_84
#undef FLASHATTN_WGMMA_OPS_88
#undef FLASHATTN_WGMMA_OPS_92
#undef FLASHATTN_WGMMA_OPS_96
#undef FLASHATTN_WGMMA_OPS_100
#undef FLASHATTN_WGMMA_OPS_104
#undef FLASHATTN_WGMMA_OPS_108
#undef FLASHATTN_WGMMA_OPS_112
#undef FLASHATTN_WGMMA_OPS_116
#undef FLASHATTN_WGMMA_OPS_120
#undef FLASHATTN_WGMMA_OPS_124
#undef FLASHATTN_WGMMA_OPS_128
#undef FLASHATTN_WGMMA_BODY_RS
#undef FLASHATTN_WGMMA_BODY_SS
#undef FLASHATTN_WGMMA_BODY_RS_E4M3
#undef FLASHATTN_WGMMA_BODY_SS_E4M3

}  // namespace detail

template <int N, WgmmaMajor kMajorA = WgmmaMajor::K, WgmmaMajor kMajorB = WgmmaMajor::K>
FLASHATTN_PTX_DEVICE void wgmma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                        int scale_d) {
  FLASHATTN_REQUIRE_SM90A(N);
  detail::WgmmaAsm<N>::template ss_bf16<static_cast<int>(kMajorA), static_cast<int>(kMajorB)>(
      d, desc_a, desc_b, scale_d);
}
template <int N, WgmmaMajor kMajorA = WgmmaMajor::K, WgmmaMajor kMajorB = WgmmaMajor::K>
FLASHATTN_PTX_DEVICE void wgmma_f16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                       int scale_d) {
  FLASHATTN_REQUIRE_SM90A(N);
  detail::WgmmaAsm<N>::template ss_f16<static_cast<int>(kMajorA), static_cast<int>(kMajorB)>(
      d, desc_a, desc_b, scale_d);
}
template <int N, WgmmaMajor kMajorB = WgmmaMajor::K>
FLASHATTN_PTX_DEVICE void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                        int scale_d) {
  FLASHATTN_REQUIRE_SM90A(N);
  detail::WgmmaAsm<N>::template rs_bf16<static_cast<int>(kMajorB)>(d, a, desc_b, scale_d);
}
template <int N, WgmmaMajor kMajorB = WgmmaMajor::K>
FLASHATTN_PTX_DEVICE void wgmma_f16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                       int scale_d) {
  FLASHATTN_REQUIRE_SM90A(N);
  detail::WgmmaAsm<N>::template rs_f16<static_cast<int>(kMajorB)>(d, a, desc_b, scale_d);
}
template <int N>
FLASHATTN_PTX_DEVICE void wgmma_e4m3_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                        int scale_d) {
  FLASHATTN_REQUIRE_SM90A(N);
  detail::WgmmaAsm<N>::ss_e4m3(d, desc_a, desc_b, scale_d);
}
template <int N>
FLASHATTN_PTX_DEVICE void wgmma_e4m3_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                        int scale_d) {
  FLASHATTN_REQUIRE_SM90A(N);
  detail::WgmmaAsm<N>::rs_e4m3(d, a, desc_b, scale_d);
}

// Templates only so that the sm_90a check fires where a kernel calls them; call them as
// wgmma_fence() and wgmma_commit_group().
template <int kDependent = 0>
FLASHATTN_PTX_DEVICE void wgmma_fence() {
  FLASHATTN_REQUIRE_SM90A(kDependent);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
template <int kDependent = 0>
FLASHATTN_PTX_DEVICE void wgmma_commit_group() {
  FLASHATTN_REQUIRE_SM90A(kDependent);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
FLASHATTN_PTX_DEVICE void wgmma_wait_group() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group N: 0 to 7");
  FLASHATTN_REQUIRE_SM90A(N);
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The accumulators are registers the compiler sees only as the asm's operands: this empty asm
// "reads and writes" each one, so reads of D are not hoisted above a wait_group nor writes sunk
// below a wgmma (CUTLASS's warpgroup_fence_operand).
template <int K>
FLASHATTN_PTX_DEVICE void wgmma_fence_operand(float (&regs)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(regs[i])::"memory");
}
template <int K>
FLASHATTN_PTX_DEVICE void wgmma_fence_operand(uint32_t (&regs)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+r"(regs[i])::"memory");
}

// setmaxnreg needs the kernel's register count at entry: give the kernel __launch_bounds__
// (e.g. (384, 1): 168 registers), else ptxas ignores it with warning C7508.
template <int kRegisters>
FLASHATTN_PTX_DEVICE void setmaxnreg_inc() {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0,
                "setmaxnreg: 24 to 256, a multiple of 8");
  FLASHATTN_REQUIRE_SM90A(kRegisters);
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
FLASHATTN_PTX_DEVICE void setmaxnreg_dec() {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0,
                "setmaxnreg: 24 to 256, a multiple of 8");
  FLASHATTN_REQUIRE_SM90A(kRegisters);
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

FLASHATTN_PTX_DEVICE void fence_proxy_async_shared_cta() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

FLASHATTN_PTX_DEVICE void stmatrix_x1(void* smem_row, uint32_t r0) {
  asm volatile("stmatrix.sync.aligned.m8n8.x1.shared.b16 [%0], {%1};\n"
               ::"r"(smem_u32addr(smem_row)), "r"(r0) : "memory");
}
FLASHATTN_PTX_DEVICE void stmatrix_x2(void* smem_row, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n"
               ::"r"(smem_u32addr(smem_row)), "r"(r0), "r"(r1) : "memory");
}
FLASHATTN_PTX_DEVICE void stmatrix_x4(void* smem_row, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(smem_u32addr(smem_row)), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
FLASHATTN_PTX_DEVICE void stmatrix_x1_trans(void* smem_row, uint32_t r0) {
  asm volatile("stmatrix.sync.aligned.m8n8.x1.trans.shared.b16 [%0], {%1};\n"
               ::"r"(smem_u32addr(smem_row)), "r"(r0) : "memory");
}
FLASHATTN_PTX_DEVICE void stmatrix_x2_trans(void* smem_row, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n"
               ::"r"(smem_u32addr(smem_row)), "r"(r0), "r"(r1) : "memory");
}
FLASHATTN_PTX_DEVICE void stmatrix_x4_trans(void* smem_row, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(smem_u32addr(smem_row)), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

#undef FLASHATTN_REQUIRE_SM90A
#undef FLASHATTN_SM90A_PTX

#endif

}  // namespace ptx
}  // namespace flashattn

#undef FLASHATTN_SM90_HD
#undef FLASHATTN_SM90_MMA_SHIM
