// sm_90 bulk copies and TMA tensor copies. Included at the end of ptx.cuh (which defines
// FLASHATTN_PTX_DEVICE / FLASHATTN_PTX_SITE) for sm_90 device code, the host pass and the CPU
// shim; an sm_80 device pass never sees it.
//
// Loads land in shared memory asynchronously and complete_tx their bytes on an mbarrier (announce
// them first with mbarrier_arrive_expect_tx / mbarrier_expect_tx, then wait on its phase).
// Stores and reductions to global memory join the issuing thread's bulk group: commit it with
// bulk_commit_group(), then bulk_wait_group_read<N>() before the shared-memory source is reused
// and bulk_wait_group<N>() before their writes must be visible.
//
// `tensor_map` is the address of a CUtensorMap (csrc/cuda/tensor_map.h: flashattn::TensorMap):
// a `const __grid_constant__` kernel parameter, or one in global or constant memory. Coordinates
// are signed element indices, innermost dimension first; box elements outside the tensor are
// zero-filled by loads and skipped by stores. Tensor copies need a 128-byte aligned shared-memory
// box; a swizzled one is laid out by the tensor map's swizzle (tests/cudasim/src/swizzle.h), from
// the absolute shared-memory address, so place it 1024-byte aligned.
#pragma once
#include <cstdint>

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
#include "src/tma.h"  // tests/cudasim/src: the shim's sm_90 entry points beyond cudasim.h
#endif

namespace flashattn {
namespace ptx {

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [smem_dst], [gmem_src], bytes, [bar]
FLASHATTN_PTX_DEVICE void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes,
                                        uint64_t* bar FLASHATTN_PTX_SITE) {
  ::cudasim::detail::bulk_copy_global_to_shared(smem_dst, gmem_src, bytes, bar, file, line);
}
// cp.async.bulk.global.shared::cta.bulk_group [gmem_dst], [smem_src], bytes
FLASHATTN_PTX_DEVICE void bulk_copy_s2g(void* gmem_dst, const void* smem_src, uint32_t bytes FLASHATTN_PTX_SITE) {
  ::cudasim::detail::bulk_copy_shared_to_global(gmem_dst, smem_src, bytes, file, line);
}
// cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [gmem_dst], [smem_src], bytes
FLASHATTN_PTX_DEVICE void bulk_reduce_add_f32(float* gmem_dst, const float* smem_src,
                                              uint32_t bytes FLASHATTN_PTX_SITE) {
  ::cudasim::detail::bulk_reduce_add_f32(gmem_dst, smem_src, bytes, file, line);
}
// cp.async.bulk.commit_group
FLASHATTN_PTX_DEVICE void bulk_commit_group(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::bulk_commit_group(file, line);
}
// cp.async.bulk.wait_group N: at most N of this thread's committed bulk groups still pending.
template <int N>
FLASHATTN_PTX_DEVICE void bulk_wait_group(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::bulk_wait_group(N, false, file, line);
}
// cp.async.bulk.wait_group.read N: the older groups have finished reading shared memory.
template <int N>
FLASHATTN_PTX_DEVICE void bulk_wait_group_read(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::bulk_wait_group(N, true, file, line);
}

// cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes
FLASHATTN_PTX_DEVICE void tma_load_2d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                      int32_t c1 FLASHATTN_PTX_SITE) {
  const int32_t c[2] = {c0, c1};
  ::cudasim::detail::tma_load(smem_dst, tensor_map, bar, c, 2, file, line);
}
FLASHATTN_PTX_DEVICE void tma_load_3d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                      int32_t c1, int32_t c2 FLASHATTN_PTX_SITE) {
  const int32_t c[3] = {c0, c1, c2};
  ::cudasim::detail::tma_load(smem_dst, tensor_map, bar, c, 3, file, line);
}
FLASHATTN_PTX_DEVICE void tma_load_4d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                      int32_t c1, int32_t c2, int32_t c3 FLASHATTN_PTX_SITE) {
  const int32_t c[4] = {c0, c1, c2, c3};
  ::cudasim::detail::tma_load(smem_dst, tensor_map, bar, c, 4, file, line);
}
FLASHATTN_PTX_DEVICE void tma_load_5d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                      int32_t c1, int32_t c2, int32_t c3, int32_t c4 FLASHATTN_PTX_SITE) {
  const int32_t c[5] = {c0, c1, c2, c3, c4};
  ::cudasim::detail::tma_load(smem_dst, tensor_map, bar, c, 5, file, line);
}

// cp.async.bulk.tensor.Nd.global.shared::cta.tile.bulk_group
FLASHATTN_PTX_DEVICE void tma_store_2d(const void* tensor_map, const void* smem_src, int32_t c0,
                                       int32_t c1 FLASHATTN_PTX_SITE) {
  const int32_t c[2] = {c0, c1};
  ::cudasim::detail::tma_store(tensor_map, smem_src, c, 2, false, file, line);
}
FLASHATTN_PTX_DEVICE void tma_store_3d(const void* tensor_map, const void* smem_src, int32_t c0, int32_t c1,
                                       int32_t c2 FLASHATTN_PTX_SITE) {
  const int32_t c[3] = {c0, c1, c2};
  ::cudasim::detail::tma_store(tensor_map, smem_src, c, 3, false, file, line);
}
FLASHATTN_PTX_DEVICE void tma_store_4d(const void* tensor_map, const void* smem_src, int32_t c0, int32_t c1,
                                       int32_t c2, int32_t c3 FLASHATTN_PTX_SITE) {
  const int32_t c[4] = {c0, c1, c2, c3};
  ::cudasim::detail::tma_store(tensor_map, smem_src, c, 4, false, file, line);
}
FLASHATTN_PTX_DEVICE void tma_store_5d(const void* tensor_map, const void* smem_src, int32_t c0, int32_t c1,
                                       int32_t c2, int32_t c3, int32_t c4 FLASHATTN_PTX_SITE) {
  const int32_t c[5] = {c0, c1, c2, c3, c4};
  ::cudasim::detail::tma_store(tensor_map, smem_src, c, 5, false, file, line);
}

// cp.reduce.async.bulk.tensor.Nd.global.shared::cta.add.tile.bulk_group: global += box, in the
// tensor map's element type (the shim models f32).
FLASHATTN_PTX_DEVICE void tma_reduce_add_2d(const void* tensor_map, const void* smem_src, int32_t c0,
                                            int32_t c1 FLASHATTN_PTX_SITE) {
  const int32_t c[2] = {c0, c1};
  ::cudasim::detail::tma_store(tensor_map, smem_src, c, 2, true, file, line);
}
FLASHATTN_PTX_DEVICE void tma_reduce_add_3d(const void* tensor_map, const void* smem_src, int32_t c0,
                                            int32_t c1, int32_t c2 FLASHATTN_PTX_SITE) {
  const int32_t c[3] = {c0, c1, c2};
  ::cudasim::detail::tma_store(tensor_map, smem_src, c, 3, true, file, line);
}
FLASHATTN_PTX_DEVICE void tma_reduce_add_4d(const void* tensor_map, const void* smem_src, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3 FLASHATTN_PTX_SITE) {
  const int32_t c[4] = {c0, c1, c2, c3};
  ::cudasim::detail::tma_store(tensor_map, smem_src, c, 4, true, file, line);
}
FLASHATTN_PTX_DEVICE void tma_reduce_add_5d(const void* tensor_map, const void* smem_src, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3, int32_t c4 FLASHATTN_PTX_SITE) {
  const int32_t c[5] = {c0, c1, c2, c3, c4};
  ::cudasim::detail::tma_store(tensor_map, smem_src, c, 5, true, file, line);
}

// prefetch.tensormap [tensor_map]: brings the descriptor into the cache ahead of the first copy.
FLASHATTN_PTX_DEVICE void tma_prefetch_descriptor(const void* tensor_map FLASHATTN_PTX_SITE) {
  ::cudasim::detail::tma_prefetch(tensor_map, file, line);
}

#else  // nvcc

FLASHATTN_PTX_DEVICE void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_u32addr(smem_dst)),
      "l"(gmem_src), "r"(bytes), "r"(smem_u32addr(bar))
      : "memory");
}
FLASHATTN_PTX_DEVICE void bulk_copy_s2g(void* gmem_dst, const void* smem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem_dst),
               "r"(smem_u32addr(smem_src)), "r"(bytes)
               : "memory");
}
FLASHATTN_PTX_DEVICE void bulk_reduce_add_f32(float* gmem_dst, const float* smem_src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   gmem_dst),
               "r"(smem_u32addr(smem_src)), "r"(bytes)
               : "memory");
}
FLASHATTN_PTX_DEVICE void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
FLASHATTN_PTX_DEVICE void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
template <int N>
FLASHATTN_PTX_DEVICE void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

FLASHATTN_PTX_DEVICE void tma_load_2d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                      int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_u32addr(smem_dst)),
      "l"(tensor_map), "r"(smem_u32addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
FLASHATTN_PTX_DEVICE void tma_load_3d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                      int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_u32addr(smem_dst)),
      "l"(tensor_map), "r"(smem_u32addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
FLASHATTN_PTX_DEVICE void tma_load_4d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                      int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_u32addr(smem_dst)),
      "l"(tensor_map), "r"(smem_u32addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
FLASHATTN_PTX_DEVICE void tma_load_5d(void* smem_dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                      int32_t c1, int32_t c2, int32_t c3, int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(smem_u32addr(smem_dst)),
      "l"(tensor_map), "r"(smem_u32addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

FLASHATTN_PTX_DEVICE void tma_store_2d(const void* tensor_map, const void* smem_src, int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   tensor_map),
               "r"(smem_u32addr(smem_src)), "r"(c0), "r"(c1)
               : "memory");
}
FLASHATTN_PTX_DEVICE void tma_store_3d(const void* tensor_map, const void* smem_src, int32_t c0, int32_t c1,
                                       int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          tensor_map),
      "r"(smem_u32addr(smem_src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
FLASHATTN_PTX_DEVICE void tma_store_4d(const void* tensor_map, const void* smem_src, int32_t c0, int32_t c1,
                                       int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          tensor_map),
      "r"(smem_u32addr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
FLASHATTN_PTX_DEVICE void tma_store_5d(const void* tensor_map, const void* smem_src, int32_t c0, int32_t c1,
                                       int32_t c2, int32_t c3, int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(
          tensor_map),
      "r"(smem_u32addr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

FLASHATTN_PTX_DEVICE void tma_reduce_add_2d(const void* tensor_map, const void* smem_src, int32_t c0,
                                            int32_t c1) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          tensor_map),
      "r"(smem_u32addr(smem_src)), "r"(c0), "r"(c1)
      : "memory");
}
FLASHATTN_PTX_DEVICE void tma_reduce_add_3d(const void* tensor_map, const void* smem_src, int32_t c0,
                                            int32_t c1, int32_t c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          tensor_map),
      "r"(smem_u32addr(smem_src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
FLASHATTN_PTX_DEVICE void tma_reduce_add_4d(const void* tensor_map, const void* smem_src, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(tensor_map),
      "r"(smem_u32addr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
FLASHATTN_PTX_DEVICE void tma_reduce_add_5d(const void* tensor_map, const void* smem_src, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3, int32_t c4) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.5d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(tensor_map),
      "r"(smem_u32addr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

FLASHATTN_PTX_DEVICE void tma_prefetch_descriptor(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

#endif

}  // namespace ptx
}  // namespace flashattn
