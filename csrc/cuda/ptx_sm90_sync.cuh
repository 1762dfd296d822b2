// sm_90 synchronization: mbarrier objects and named barriers. Included at the end of ptx.cuh
// (which defines FLASHATTN_PTX_DEVICE / FLASHATTN_PTX_SITE) for sm_90 device code, the host
// pass and the CPU shim; an sm_80 device pass never sees it.
//
// mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier"): a
// 64-bit object in shared memory, 8-byte aligned, counting arrivals and transaction bytes per
// phase. The shim keeps its state beside the block and reports misuse by name
// (tests/cudasim/README.md, "Warp-specialized synchronization").
#pragma once
#include <cstdint>

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
#include "src/tma.h"  // tests/cudasim/src: the shim's sm_90 entry points beyond cudasim.h
#endif

namespace flashattn {
namespace ptx {

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)

// mbarrier.init.shared::cta.b64 [bar], count: `count` arrivals per phase (1 to 2^20 - 1).
FLASHATTN_PTX_DEVICE void mbarrier_init(uint64_t* bar, uint32_t count FLASHATTN_PTX_SITE) {
  ::cudasim::detail::mbarrier_init(bar, count, file, line);
}
// mbarrier.inval.shared::cta.b64 [bar]: the object is plain memory again.
FLASHATTN_PTX_DEVICE void mbarrier_inval(uint64_t* bar FLASHATTN_PTX_SITE) {
  ::cudasim::detail::mbarrier_inval(bar, file, line);
}
// fence.mbarrier_init.release.cluster: makes mbarrier.init visible to the async proxy (TMA) and
// other threads before they use the barrier. Nothing is reordered on the shim; it is counted.
FLASHATTN_PTX_DEVICE void fence_mbarrier_init(FLASHATTN_PTX_SITE_ONLY) {
  ::cudasim::detail::mbarrier_fence_init(file, line);
}
// mbarrier.arrive.shared::cta.b64 state, [bar] (, count): returns the state token (the phase).
FLASHATTN_PTX_DEVICE uint64_t mbarrier_arrive(uint64_t* bar FLASHATTN_PTX_SITE) {
  return ::cudasim::detail::mbarrier_arrive(bar, 1, file, line);
}
FLASHATTN_PTX_DEVICE uint64_t mbarrier_arrive_count(uint64_t* bar, uint32_t count FLASHATTN_PTX_SITE) {
  return ::cudasim::detail::mbarrier_arrive(bar, count, file, line);
}
// mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], tx_bytes: expect tx_bytes more
// transaction bytes in the current phase, then arrive once.
FLASHATTN_PTX_DEVICE uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes FLASHATTN_PTX_SITE) {
  return ::cudasim::detail::mbarrier_arrive_expect_tx(bar, tx_bytes, file, line);
}
// mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], tx_bytes: expect without arriving.
FLASHATTN_PTX_DEVICE void mbarrier_expect_tx(uint64_t* bar, uint32_t tx_bytes FLASHATTN_PTX_SITE) {
  ::cudasim::detail::mbarrier_expect_tx(bar, tx_bytes, file, line);
}
// mbarrier.try_wait.parity.shared::cta.b64: true once the phase of this parity has completed.
// Hardware may return false after a time limit; the shim blocks until it is true.
FLASHATTN_PTX_DEVICE bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity FLASHATTN_PTX_SITE) {
  return ::cudasim::detail::mbarrier_try_wait_parity(bar, parity, file, line);
}
// The wait every pipeline writes: try_wait.parity until it succeeds.
FLASHATTN_PTX_DEVICE void mbarrier_wait_parity(uint64_t* bar, uint32_t parity FLASHATTN_PTX_SITE) {
  while (!::cudasim::detail::mbarrier_try_wait_parity(bar, parity, file, line)) {
  }
}
// mbarrier.test_wait.parity.shared::cta.b64: never blocks. Spinning on it hangs on the shim (no
// other warp runs meanwhile): wait with mbarrier_wait_parity.
FLASHATTN_PTX_DEVICE bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity FLASHATTN_PTX_SITE) {
  return ::cudasim::detail::mbarrier_test_wait_parity(bar, parity, file, line);
}

// bar.sync id, threads / bar.arrive id, threads: named barrier `id` (0-15) for `threads`
// threads, a multiple of 32. named_barrier_sync(id, 0) is bar.sync id: every thread of the CTA.
FLASHATTN_PTX_DEVICE void named_barrier_sync(unsigned id, unsigned threads FLASHATTN_PTX_SITE) {
  ::cudasim::detail::count_named_barrier(false, file, line);
  ::cudasim::detail::barrier_sync(id, threads, file, line);
}
FLASHATTN_PTX_DEVICE void named_barrier_arrive(unsigned id, unsigned threads FLASHATTN_PTX_SITE) {
  ::cudasim::detail::count_named_barrier(true, file, line);
  ::cudasim::detail::barrier_arrive(id, threads, file, line);
}

#else  // nvcc

FLASHATTN_PTX_DEVICE void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32addr(bar)), "r"(count)
               : "memory");
}
FLASHATTN_PTX_DEVICE void mbarrier_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_u32addr(bar)) : "memory");
}
FLASHATTN_PTX_DEVICE void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
FLASHATTN_PTX_DEVICE uint64_t mbarrier_arrive(uint64_t* bar) {
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];\n"
               : "=l"(state)
               : "r"(smem_u32addr(bar))
               : "memory");
  return state;
}
FLASHATTN_PTX_DEVICE uint64_t mbarrier_arrive_count(uint64_t* bar, uint32_t count) {
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(smem_u32addr(bar)), "r"(count)
               : "memory");
  return state;
}
FLASHATTN_PTX_DEVICE uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
  uint64_t state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(smem_u32addr(bar)), "r"(tx_bytes)
               : "memory");
  return state;
}
FLASHATTN_PTX_DEVICE void mbarrier_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32addr(bar)),
               "r"(tx_bytes)
               : "memory");
}
FLASHATTN_PTX_DEVICE bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
FLASHATTN_PTX_DEVICE void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}
FLASHATTN_PTX_DEVICE bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

FLASHATTN_PTX_DEVICE void named_barrier_sync(unsigned id, unsigned threads) {
  if (threads == 0) {
    asm volatile("bar.sync %0;\n" ::"r"(id) : "memory");
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
  }
}
FLASHATTN_PTX_DEVICE void named_barrier_arrive(unsigned id, unsigned threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif

}  // namespace ptx
}  // namespace flashattn
