// The only place PTX appears. Under nvcc each wrapper is inline asm; under the CPU shim
// (FLASHATTN_CUDASIM, g++ with tests/cudasim/cudasim.h) it calls the emulation, and its trailing
// defaulted file/line arguments let the shim's diagnostics name the kernel's call site.
//
// Fragment layouts are the PTX ISA's: see tests/cudasim/src/tensor_core.cpp for the lane maps,
// and tests/cudasim/layout_check.py for the check that hardware agrees with them.
#pragma once
#include <cstdint>

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
#include "cudasim.h"
#define FLASHATTN_PTX_DEVICE inline
#define FLASHATTN_PTX_SITE , const char *file = __builtin_FILE(), int line = __builtin_LINE()
#define FLASHATTN_PTX_SITE_ONLY const char *file = __builtin_FILE(), int line = __builtin_LINE()
// Dynamic shared memory: 128-byte aligned, exact size, refilled with 0xFF before each block.
#define FLASHATTN_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(::cudasim::dynamic_smem())
#else
#define FLASHATTN_PTX_DEVICE __device__ __forceinline__
#define FLASHATTN_PTX_SITE
#define FLASHATTN_PTX_SITE_ONLY
#define FLASHATTN_DYNAMIC_SMEM(type, name) extern __shared__ __align__(128) type name[]
#endif

namespace flashattn {
namespace ptx {

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)

FLASHATTN_PTX_DEVICE uint32_t smem_u32addr(const void* smem_ptr FLASHATTN_PTX_SITE) {
  return ::cudasim::detail::smem_offset(smem_ptr, file, line);
}

FLASHATTN_PTX_DEVICE void ldmatrix_x1(uint32_t& r0, const void* smem_row FLASHATTN_PTX_SITE) {
  ::cudasim::detail::ldmatrix(1, false, &r0, smem_row, file, line);
}
FLASHATTN_PTX_DEVICE void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* smem_row FLASHATTN_PTX_SITE) {
  uint32_t r[2];
  ::cudasim::detail::ldmatrix(2, false, r, smem_row, file, line);
  r0 = r[0], r1 = r[1];
}
FLASHATTN_PTX_DEVICE void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                      const void* smem_row FLASHATTN_PTX_SITE) {
  uint32_t r[4];
  ::cudasim::detail::ldmatrix(4, false, r, smem_row, file, line);
  r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
FLASHATTN_PTX_DEVICE void ldmatrix_x1_trans(uint32_t& r0, const void* smem_row FLASHATTN_PTX_SITE) {
  ::cudasim::detail::ldmatrix(1, true, &r0, smem_row, file, line);
}
FLASHATTN_PTX_DEVICE void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const void* smem_row FLASHATTN_PTX_SITE) {
  uint32_t r[2];
  ::cudasim::detail::ldmatrix(2, true, r, smem_row, file, line);
  r0 = r[0], r1 = r[1];
}
FLASHATTN_PTX_DEVICE void ldmatrix_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                            const void* smem_row FLASHATTN_PTX_SITE) {
  uint32_t r[4];
  ::cudasim::detail::ldmatrix(4, true, r, smem_row, file, line);
  r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}

FLASHATTN_PTX_DEVICE void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4],
                                           const uint32_t (&b)[2] FLASHATTN_PTX_SITE) {
  ::cudasim::detail::mma_m16n8k16(::cudasim::detail::MmaInput::F16, d, a, b, file, line);
}
FLASHATTN_PTX_DEVICE void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2] FLASHATTN_PTX_SITE) {
  ::cudasim::detail::mma_m16n8k16(::cudasim::detail::MmaInput::BF16, d, a, b, file, line);
}

FLASHATTN_PTX_DEVICE void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes FLASHATTN_PTX_SITE) {
  ::cudasim::detail::cp_async_16(smem_dst, gmem_src, src_bytes, file, line);
}
FLASHATTN_PTX_DEVICE void cp_async_commit(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::cp_async_commit(file, line);
}
template <int N>
FLASHATTN_PTX_DEVICE void cp_async_wait(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::cp_async_wait_group(N, file, line);
}
FLASHATTN_PTX_DEVICE void cp_async_wait_all(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::cp_async_wait_all(file, line);
}

// ex2.approx.ftz.f32 has ~2 ulp error and flushes subnormals; the shim computes exp2f exactly.
FLASHATTN_PTX_DEVICE float exp2_approx(float x) { return exp2f(x); }

#else  // nvcc

FLASHATTN_PTX_DEVICE uint32_t smem_u32addr(const void* smem_ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
}

FLASHATTN_PTX_DEVICE void ldmatrix_x1(uint32_t& r0, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r0)
               : "r"(smem_u32addr(smem_row)));
}
FLASHATTN_PTX_DEVICE void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_u32addr(smem_row)));
}
FLASHATTN_PTX_DEVICE void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                      const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32addr(smem_row)));
}
FLASHATTN_PTX_DEVICE void ldmatrix_x1_trans(uint32_t& r0, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r0)
               : "r"(smem_u32addr(smem_row)));
}
FLASHATTN_PTX_DEVICE void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_u32addr(smem_row)));
}
FLASHATTN_PTX_DEVICE void ldmatrix_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                            const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32addr(smem_row)));
}

FLASHATTN_PTX_DEVICE void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
FLASHATTN_PTX_DEVICE void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

FLASHATTN_PTX_DEVICE void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :
               : "r"(smem_u32addr(smem_dst)), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}
FLASHATTN_PTX_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
FLASHATTN_PTX_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
FLASHATTN_PTX_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

FLASHATTN_PTX_DEVICE float exp2_approx(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#endif

}  // namespace ptx
}  // namespace flashattn

#undef FLASHATTN_PTX_DEVICE
#undef FLASHATTN_PTX_SITE
#undef FLASHATTN_PTX_SITE_ONLY
