// Host side of the fp32 SIMT kernels (simt_kernels.cuh): shared-memory opt-ins and launches of
// what the plan chose (plan_fwd.h, plan_bwd.h). Compiles under nvcc and under the CPU shim.
#pragma once
#include "../params.h"
#include "bwd_row_kernels.cuh"
#include "grid.h"
#include "launch.cuh"
#include "plan_bwd.h"
#include "plan_fwd.h"
#include "simt_kernels.cuh"
#include "traits.h"

namespace flashattn::cuda {

// Forward for fp32 inputs on a head-dim tile >= tile_head_dim(p), on p as planned
// (FwdPlan::params); batch, heads, seqlen_q > 0.
template <int kHeadDim>
void run_fwd_simt(const AttnParams& p, float* split_scratch, cudaStream_t stream,
                  LaunchCheck after_launch) {
  constexpr FwdLaunchShape shape = simt_fwd_shape<kHeadDim>();
  launch_with_smem(&simt_fwd_kernel<SimtTraits<kHeadDim>>, shape.grid(p), shape.block(),
                   shape.smem_bytes, stream, p, split_scratch);
  after_launch();
}

// Backward for fp32 inputs: the steps of bwd_steps_simt (plan_bwd.h), D_i, then dK/dV per key
// rows, then dQ per query rows. Both passes sum in a fixed order, so it is deterministic
// whatever p.deterministic says. workspace: D_i, [Hq, total_q] floats (mask.h,
// query_row_index).
template <int kHeadDim>
void run_bwd_simt(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                  LaunchCheck after_launch) {
  using Traits = SimtTraits<kHeadDim>;
  for (const BwdStep& step : bwd_steps_simt<kHeadDim>(p)) {
    switch (step.kernel) {
      case BwdKernel::kDotDoO:
        FLASHATTN_LAUNCH_KERNEL(bwd_dot_do_o_kernel<float>, step.grid, step.block,
                                step.smem_bytes, stream, p, workspace, nullptr, 0);
        break;
      case BwdKernel::kDkdv:
        launch_with_smem(&simt_dkdv_kernel<Traits>, step.grid, step.block, step.smem_bytes,
                         stream, p, workspace);
        break;
      case BwdKernel::kDq:
        launch_with_smem(&simt_dq_kernel<Traits>, step.grid, step.block, step.smem_bytes, stream,
                         p, workspace);
        break;
      case BwdKernel::kConvertDq:  // not a SIMT step: its dQ kernel writes dq itself
        break;
    }
    after_launch();
  }
}

}  // namespace flashattn::cuda
