// The sm_90 synchronization wrappers as csrc/cuda/ptx.cuh will spell them under the shim: each
// forwards to cudasim's entry point with the kernel's call site. Until ptx.cuh has them, the
// self-tests use these, so they exercise exactly the API those wrappers will call.
#pragma once
#include <cstdint>

namespace sm90 {

#define SM90_SITE const char *file = __builtin_FILE(), int line = __builtin_LINE()

inline void mbarrier_init(uint64_t* bar, uint32_t arrivals, SM90_SITE) {
  cudasim::detail::mbarrier_init(bar, arrivals, file, line);
}
inline uint64_t mbarrier_arrive(uint64_t* bar, SM90_SITE) {
  return cudasim::detail::mbarrier_arrive(bar, 1, file, line);
}
inline uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes, SM90_SITE) {
  return cudasim::detail::mbarrier_arrive_expect_tx(bar, tx_bytes, file, line);
}
// The spin loop CUTLASS writes around try_wait.parity; the shim's try_wait blocks until done.
inline void mbarrier_wait(uint64_t* bar, uint32_t parity, SM90_SITE) {
  while (!cudasim::detail::mbarrier_try_wait_parity(bar, parity, file, line)) {
  }
}
inline bool mbarrier_test_wait(uint64_t* bar, uint32_t parity, SM90_SITE) {
  return cudasim::detail::mbarrier_test_wait_parity(bar, parity, file, line);
}
inline void bulk_copy_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar,
                          SM90_SITE) {
  cudasim::detail::bulk_copy_global_to_shared(smem_dst, gmem_src, bytes, bar, file, line);
}
inline void named_barrier_sync(unsigned id, unsigned threads, SM90_SITE) {
  cudasim::detail::barrier_sync(id, threads, file, line);
}
inline void named_barrier_arrive(unsigned id, unsigned threads, SM90_SITE) {
  cudasim::detail::barrier_arrive(id, threads, file, line);
}

#undef SM90_SITE

}  // namespace sm90
