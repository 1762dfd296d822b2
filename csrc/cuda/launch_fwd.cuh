// Host side of the 16-bit forward launch: shared-memory opt-in and launch of the kernel the plan
// chose (plan_fwd.h). Compiles under nvcc and under the CPU shim alike; the torch glue (device
// guard, stream, error check) is in api.cu.
#pragma once
#include "../params.h"
#include "fwd_kernel.cuh"
#include "grid.h"
#include "launch.cuh"
#include "plan_fwd.h"
#include "traits.h"

namespace flashattn::cuda {

// Runs fwd_kernel_16bit for an Element (__half or __nv_bfloat16) and a head-dim tile
// (kHeadDim, kHeadDimV) that covers (p.head_dim, p.head_dim_v), on p as planned (FwdPlan::params:
// packed, split). p.seqlen_q, p.batch and p.heads_q must be > 0. Calls after_launch() right
// after the launch so the caller can check it.
template <typename Element, int kHeadDim, int kHeadDimV>
void run_fwd_16bit(const AttnParams& p, float* split_scratch, cudaStream_t stream,
                   LaunchCheck after_launch) {
  with_fwd_traits<kHeadDim, kHeadDimV>(fwd_one_m_tile<kHeadDim, kHeadDimV>(p), [&](auto traits) {
    using Traits = decltype(traits);
    constexpr FwdLaunchShape shape = FwdLaunchShape::of<Traits>();
    launch_with_smem(&fwd_kernel_16bit<Traits, Element>, shape.grid(p), shape.block(),
                     shape.smem_bytes, stream, p, split_scratch);
  });
  after_launch();
}

}  // namespace flashattn::cuda
