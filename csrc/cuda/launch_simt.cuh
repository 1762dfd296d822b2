// Host side of the fp32 SIMT kernels (simt_kernels.cuh): grids, shared-memory opt-ins,
// launches. Compiles under nvcc and under the CPU shim.
#pragma once
#include "../params.h"
#include "bwd_row_kernels.cuh"
#include "grid.h"
#include "launch.cuh"
#include "simt_kernels.cuh"
#include "traits.h"

namespace flashattn::cuda {

// Forward for fp32 inputs on a head-dim tile >= p.head_dim; batch, heads, seqlen_q > 0.
template <int kHeadDim>
void run_fwd_simt(const AttnParams& p, float* split_scratch, cudaStream_t stream,
                  LaunchCheck after_launch) {
  using Traits = SimtTraits<kHeadDim>;
  constexpr FwdLaunchShape shape = FwdLaunchShape::of<Traits>(Traits::kNWarps);
  auto* kernel = &simt_fwd_kernel<Traits>;
  allow_smem(kernel, shape.smem_bytes);
  FLASHATTN_LAUNCH_KERNEL(kernel, shape.grid(p), shape.block(), shape.smem_bytes, stream, p,
                          split_scratch);
  after_launch();
}

// Backward for fp32 inputs: D_i, then dK/dV per key rows, then dQ per query rows. Both
// passes sum in a fixed order, so it is deterministic whatever p.deterministic says.
// workspace: D_i, [Hq, total_q] floats (mask.h, query_row_index).
template <int kHeadDim>
void run_bwd_simt(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                  LaunchCheck after_launch) {
  using Traits = SimtTraits<kHeadDim>;
  const int64_t batch_heads = static_cast<int64_t>(p.batch) * p.heads_q;
  if (batch_heads == 0) return;
  if (p.seqlen_q > 0) {
    FLASHATTN_LAUNCH_KERNEL(bwd_dot_do_o_kernel<float>,
                            attention_grid(p.seqlen_q, kRowKernelWarps, batch_heads),
                            dim3(kRowKernelThreads), 0, stream, p, workspace, nullptr, 0);
    after_launch();
  }
  if (p.seqlen_k > 0) {
    auto* kernel = &simt_dkdv_kernel<Traits>;
    allow_smem(kernel, Traits::kDkdvSmemBytes);
    const dim3 grid = attention_grid(p.seqlen_k, Traits::kNWarps,
                                     static_cast<int64_t>(p.batch) * p.heads_kv);
    FLASHATTN_LAUNCH_KERNEL(kernel, grid, dim3(Traits::kNThreads), Traits::kDkdvSmemBytes, stream,
                            p, workspace);
    after_launch();
  }
  if (p.seqlen_q > 0) {
    auto* kernel = &simt_dq_kernel<Traits>;
    allow_smem(kernel, Traits::kSmemBytes);
    FLASHATTN_LAUNCH_KERNEL(kernel, attention_grid(p.seqlen_q, Traits::kNWarps, batch_heads),
                            dim3(Traits::kNThreads), Traits::kSmemBytes, stream, p, workspace);
    after_launch();
  }
}

}  // namespace flashattn::cuda
