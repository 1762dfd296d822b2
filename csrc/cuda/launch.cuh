// Host-side launch helpers, so the host glue compiles under nvcc and under the CPU shim.
//
//   auto kernel = &fwd_kernel_16bit<Traits, Element>;   // a variable: template-ids hold commas
//   flashattn::set_max_dynamic_smem(kernel, smem_bytes);
//   FLASHATTN_LAUNCH_KERNEL(kernel, grid, block, smem_bytes, stream, params);
//   FLASHATTN_LAUNCH_CHECK();   // C10_CUDA_KERNEL_LAUNCH_CHECK() under nvcc, nothing on the shim
//
// Under the shim the launch runs the whole grid on the calling host thread before returning
// (the stream is ignored) and throws cudasim::SimError on any detected error.
#pragma once
#include <cstddef>

#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)

#include "cudasim.h"

#define FLASHATTN_LAUNCH_KERNEL(kernel, grid, block, smem_bytes, stream, ...) \
  ((void)(stream), ::cudasim::launch_named(#kernel, kernel, grid, block, smem_bytes, __VA_ARGS__))
// The launch has already thrown cudasim::SimError if anything went wrong.
#define FLASHATTN_LAUNCH_CHECK() ((void)0)

namespace flashattn {
// Records the kernel's opt-in limit; a launch above it (or above 48 KB without it) fails, as it
// would on hardware. Limits above 227 KB throw here.
template <class... Params>
void set_max_dynamic_smem(void (*kernel)(Params...), size_t bytes) {
  ::cudasim::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}
}  // namespace flashattn

#else

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#define FLASHATTN_LAUNCH_KERNEL(kernel, grid, block, smem_bytes, stream, ...) \
  kernel<<<grid, block, smem_bytes, stream>>>(__VA_ARGS__)
#define FLASHATTN_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()

namespace flashattn {
template <class... Params>
void set_max_dynamic_smem(void (*kernel)(Params...), size_t bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
}
}  // namespace flashattn

#endif
