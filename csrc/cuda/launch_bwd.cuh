// Host side of the 16-bit backward: runs the steps the plan lays out (plan_bwd.h,
// bwd_steps_16bit), each with its shared-memory opt-in. Compiles under nvcc and under the CPU
// shim; the torch glue (workspace allocation, device guard, stream, error checks) is in api.cu.
#pragma once
#include "../params.h"
#include "bwd_dkdv_kernel.cuh"
#include "bwd_dq_kernel.cuh"
#include "bwd_row_kernels.cuh"
#include "grid.h"
#include "launch.cuh"
#include "plan_bwd.h"
#include "traits.h"

namespace flashattn::cuda {

// Runs the backward for an Element (__half or __nv_bfloat16) on the head-dim tile (kHeadDim,
// kHeadDimV), Q's and K's width, V's and dO's, at least p's (plan_bwd.h):
//   1. D_i = rowsum(dO_i * O_i) - dLSE_i (and zero the dQ accumulator),
//   2. dK, dV (and dQ by fp32 atomics unless p.deterministic), per key tile,
//   3. dQ: the accumulator converted, or the deterministic dQ kernel.
// workspace: BwdPlan::workspace_floats. Calls after_launch() after each launch.
template <typename Element, int kHeadDim, int kHeadDimV>
void run_bwd_16bit(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                   LaunchCheck after_launch) {
  using Traits = BwdTile<kHeadDim, kHeadDimV>;
  using DqTraits = BwdDqTile<kHeadDim, kHeadDimV>;
  float* d_gmem = workspace;
  float* dq_accum =
      bwd_dq_accum(p, KernelFamily::kTensorCore) ? workspace + dq_accum_offset(p) : nullptr;
  for (const BwdStep& step : bwd_steps_16bit<kHeadDim, kHeadDimV>(p)) {
    switch (step.kernel) {
      case BwdKernel::kDotDoO:
        FLASHATTN_LAUNCH_KERNEL(bwd_dot_do_o_kernel<Element>, step.grid, step.block,
                                step.smem_bytes, stream, p, d_gmem, dq_accum, kHeadDim);
        break;
      case BwdKernel::kDkdv:
        launch_with_smem(&bwd_dkdv_kernel_16bit<Traits, Element>, step.grid, step.block,
                         step.smem_bytes, stream, p, d_gmem, dq_accum, kHeadDim);
        break;
      case BwdKernel::kDq:
        launch_with_smem(&bwd_dq_kernel_16bit<DqTraits, Element>, step.grid, step.block,
                         step.smem_bytes, stream, p, d_gmem);
        break;
      case BwdKernel::kConvertDq:
        FLASHATTN_LAUNCH_KERNEL(bwd_convert_dq_kernel<Element>, step.grid, step.block,
                                step.smem_bytes, stream, p, dq_accum, kHeadDim);
        break;
    }
    after_launch();
  }
}

}  // namespace flashattn::cuda
