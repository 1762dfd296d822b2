// The SM count a walking sm_90a forward launch sizes its grid by (fwd_sm90_walk.h), in its own
// header so that the executor (executor.h: whether the call needs a tile counter) asks the very
// function the launch (fwd_sm90_launch.h) does. Host only.
#pragma once

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
#include "cudasim.h"
#else
#include <cuda_runtime.h>

#include <atomic>
#endif

namespace flashattn::hopper {

// The SMs of the current device (cudaDevAttrMultiProcessorCount, cached per device); the shim's
// cudasim::sm_count() (CUDASIM_SM_COUNT, default 2). 0 if unknown. The executor calls it under its
// device guard, the launch right after, so both see q's device.
inline int fwd_sm90_sm_count() {
#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
  return ::cudasim::sm_count();
#else
  constexpr int kDevices = 64;
  static std::atomic<int> counts[kDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  int count = device < kDevices ? counts[device].load(std::memory_order_relaxed) : 0;
  if (count == 0) {
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    if (device < kDevices) counts[device].store(count, std::memory_order_relaxed);
  }
  return count;
#endif
}

}  // namespace flashattn::hopper
