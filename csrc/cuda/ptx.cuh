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
#include "src/async_proxy.h"
// A __device__ helper that issues wrappers on its caller's behalf (tile_io.cuh) takes
// FLASHATTN_CALLER_SITE as its last parameter and passes FLASHATTN_CALLER_SITE_ARGS on, so the
// shim's messages and counters name the kernel's line. Both are empty under nvcc.
#define FLASHATTN_CALLER_SITE , const char *file = __builtin_FILE(), int line = __builtin_LINE()
#define FLASHATTN_CALLER_SITE_ARGS , file, line
#define FLASHATTN_PTX_DEVICE inline
#define FLASHATTN_PTX_SITE , const char *file = __builtin_FILE(), int line = __builtin_LINE()
#define FLASHATTN_PTX_SITE_ONLY const char *file = __builtin_FILE(), int line = __builtin_LINE()
// Dynamic shared memory: 1024-byte aligned (swizzled TMA and wgmma tiles need it), exact size,
// refilled with 0xFF before each block.
#define FLASHATTN_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(::cudasim::dynamic_smem())
// Counted plain accesses (see CountedPointer below).
#define FLASHATTN_SMEM(ptr) (::flashattn::ptx::counted_pointer(true, (ptr)))
#define FLASHATTN_GMEM(ptr) (::flashattn::ptx::counted_pointer(false, (ptr)))
#else
#define FLASHATTN_CALLER_SITE
#define FLASHATTN_CALLER_SITE_ARGS
#define FLASHATTN_PTX_DEVICE __device__ __forceinline__
#define FLASHATTN_PTX_SITE
#define FLASHATTN_PTX_SITE_ONLY
#define FLASHATTN_DYNAMIC_SMEM(type, name) extern __shared__ __align__(128) type name[]
#define FLASHATTN_SMEM(ptr) (ptr)
#define FLASHATTN_GMEM(ptr) (ptr)
#endif

namespace flashattn {
namespace ptx {

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)

// Plain shared- and global-memory accesses, visible to the shim's counters (README.md,
// "Counters"): wrap the pointer, keep the access as written.
//   x = FLASHATTN_SMEM(a)[i];   FLASHATTN_SMEM(a)[i] = x;   ld.shared, st.shared
//   FLASHATTN_GMEM(out)[i] = x;   *FLASHATTN_GMEM(p) = x;   st.global (ld.global likewise)
// Under nvcc each macro is its parenthesized pointer, so the access is token for token the one
// it replaces and the SASS cannot change (.ci/sass_compare.py checks it; an inline function
// returning the pointer did change register allocation). Under the shim it is an accessor that
// counts each element access at the macro's line, then makes it.
template <class T>
class CountedElement {
 public:
  CountedElement(T* ptr, bool shared, const char* file, int line)
      : ptr_(ptr), shared_(shared), file_(file), line_(line) {}
  void operator=(T value) const { store(value); }
  // a[i] = b[j] between two accessors stores an element; it does not copy the accessor.
  void operator=(const CountedElement& other) const { store(static_cast<T>(other)); }
  operator T() const {
    count(shared_ ? ::cudasim::detail::Access::SmemLoad : ::cudasim::detail::Access::GmemLoad);
    return *ptr_;
  }

 private:
  void store(T value) const {
    count(shared_ ? ::cudasim::detail::Access::SmemStore : ::cudasim::detail::Access::GmemStore);
    // A generic-proxy store: wgmma and TMA stores see it only after fence.proxy.async.
    if (shared_) ::cudasim::detail::note_generic_smem_store(ptr_, sizeof(T), file_, line_);
    *ptr_ = value;
  }
  void count(::cudasim::detail::Access kind) const {
    if (::cudasim::detail::counting_on())
      ::cudasim::detail::count_access(kind, ptr_, sizeof(T), file_, line_);
  }
  T* ptr_;
  bool shared_;
  const char* file_;
  int line_;
};

template <class T>
class CountedPointer {
 public:
  CountedPointer(T* ptr, bool shared, const char* file, int line)
      : ptr_(ptr), shared_(shared), file_(file), line_(line) {}
  template <class Index>
  CountedElement<T> operator[](Index i) const {
    return CountedElement<T>(ptr_ + i, shared_, file_, line_);
  }
  CountedElement<T> operator*() const { return CountedElement<T>(ptr_, shared_, file_, line_); }

 private:
  T* ptr_;
  bool shared_;
  const char* file_;
  int line_;
};

template <class T>
FLASHATTN_PTX_DEVICE CountedPointer<T> counted_pointer(bool shared, T* ptr FLASHATTN_PTX_SITE) {
  return CountedPointer<T>(ptr, shared, file, line);
}
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

FLASHATTN_PTX_DEVICE int thread_index() { return static_cast<int>(threadIdx.x); }

FLASHATTN_PTX_DEVICE void red_add_f32x2(float* gmem, float a, float b FLASHATTN_PTX_SITE) {
  ::cudasim::detail::red_add_f32x2(gmem, a, b, file, line);
}

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

// threadIdx.x, read where it is used: a volatile read is not hoisted, so what is computed from
// it (a tile copy's row and column) is recomputed per use instead of held in registers across
// a main loop, where the kernels at 255 registers have none to spare.
FLASHATTN_PTX_DEVICE int thread_index() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  return tid;
}

// gmem[0] += a, gmem[1] += b for an 8-byte aligned pair in global memory: one 8-byte reduction
// (red.global.add.v2.f32, PTX 8.1, sm_90) where the GPU has it, two 4-byte ones elsewhere. Half
// the instructions and L2 requests of scalar atomics for the backward's dQ.
FLASHATTN_PTX_DEVICE void red_add_f32x2(float* gmem, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(gmem), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(gmem, a);
  atomicAdd(gmem + 1, b);
#endif
}

#endif

}  // namespace ptx
}  // namespace flashattn

// sm_90 wrappers: for the shim, nvcc's host pass and sm_90+ device passes; an sm_80 device pass
// never sees their PTX. Each file expects the macros above, so include ptx.cuh, not them.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#include "ptx_sm90_sync.cuh"
#endif
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#include "ptx_sm90_tma.cuh"
#endif

// FP8 conversions: the shim, nvcc's host pass and sm_89+ device passes.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
#include "ptx_fp8.cuh"
#endif

// wgmma, setmaxnreg, fence.proxy.async and stmatrix: the shim, nvcc's host pass and sm_90+
// device passes (wgmma and setmaxnreg need sm_90a); an sm_80 device pass never sees them.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#include "ptx_sm90_mma.cuh"
#endif

#undef FLASHATTN_PTX_DEVICE
#undef FLASHATTN_PTX_SITE
#undef FLASHATTN_PTX_SITE_ONLY
