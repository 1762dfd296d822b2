// Host launch of the sm_90a forward, under nvcc (a stream) and under the CPU shim (the grid runs
// on the calling thread; errors throw cudasim::SimError). Callers: the library's launch template
// (csrc/cuda/launch_fwd_sm90.cuh), tests/cudasim/selftest/hopper_fwd_test.cpp and
// tests/cudasim/hopper_fwd_gpu.cu.
#pragma once
#include <string>

#include "cuda/hopper/fwd_sm90_kernel.cuh"
#include "cuda/hopper/fwd_sm90_sms.h"

#if !(defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__))
#include <cuda_runtime.h>
#endif

namespace flashattn::hopper {

template <int kHeadDim>
dim3 fwd_sm90_grid(const FwdSm90Params& p) {
  const FwdSm90GridDims g = FwdSm90Config<kHeadDim>::grid(p.seqlen_q, p.heads_q, p.batch, p.num_splits,
                                                                p.packed_heads);
  return dim3(g.x, g.y, g.z);
}

// "" on success, else why the launch failed.
template <typename Elem, int kHeadDim, bool kCausal, bool kSoftcap = false, bool kLocal = false,
          bool kAlibi = false, bool kAttnMask = false, bool kGatherKv = false, bool kDropout = false>
std::string launch_fwd_sm90(const FwdSm90Maps& maps, const FwdSm90Params& p, void* stream) {
  using Cfg = FwdSm90ConfigOf<Elem, kHeadDim, kGatherKv>;
  auto kernel = fwd_sm90_kernel<Elem, kHeadDim, kCausal, kSoftcap, kLocal, kAlibi, kAttnMask, kGatherKv, kDropout>;
  dim3 grid = fwd_sm90_grid<kHeadDim>(p);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "";
  // A walking kernel (fwd_sm90_walk.h): one CTA per SM, at most one per tile; the places past
  // the grid's from the call's counter, zeroed here, which a grid covering every place never
  // reads (fwd_sm90_walk_counts, the executor's rule too): such a call allocates and zeroes nothing.
  constexpr bool kWalks = fwd_sm90_walks(kHeadDim, kLocal, kSoftcap, kAlibi, kAttnMask, kGatherKv, kDropout, Cfg::kTransposeV);
  [[maybe_unused]] bool counts = false;
  if constexpr (kWalks) {
    const unsigned tiles = grid.x * grid.y * grid.z;  // < 2^32: the plan's limits (plan_fwd_sm90.h)
    const int sms = fwd_sm90_sm_count();
    if (sms <= 0) return "the device's SM count is unknown";
    counts = fwd_sm90_walk_counts(tiles, sms);
    if (counts && p.tile_counter == nullptr)
      return "a walking kernel of " + std::to_string(tiles) + " tiles on " + std::to_string(sms) +
             " SMs needs FwdSm90Params::tile_counter (4 bytes of device memory), got none";
    grid = dim3(fwd_sm90_walk_ctas(tiles, sms), 1, 1);
  }
#if defined(FLASHATTN_CUDASIM) && !defined(__CUDACC__)
  (void)stream;
  if (counts) *p.tile_counter = 0;  // cudaMemsetAsync's stand-in
  ::cudasim::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::smem_bytes(kWalks));
  ::cudasim::launch(kernel, grid, dim3(Cfg::kThreads), Cfg::smem_bytes(kWalks), maps.q, maps.k, maps.v, maps.o, p);
  return "";
#else
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(Cfg::smem_bytes(kWalks)));
  if (status != cudaSuccess) return std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(status);
  if (counts) {
    status = cudaMemsetAsync(p.tile_counter, 0, sizeof(unsigned), static_cast<cudaStream_t>(stream));
    if (status != cudaSuccess) return std::string("cudaMemsetAsync (the tile counter): ") + cudaGetErrorString(status);
  }
  kernel<<<grid, Cfg::kThreads, Cfg::smem_bytes(kWalks), static_cast<cudaStream_t>(stream)>>>(maps.q, maps.k, maps.v, maps.o, p);
  status = cudaGetLastError();
  if (status != cudaSuccess) return std::string("launch: ") + cudaGetErrorString(status);
  return "";
#endif
}

}  // namespace flashattn::hopper
