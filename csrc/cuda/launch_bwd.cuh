// Host side of the backward: the sequence of launches, their grids and shared-memory opt-ins.
// Compiles under nvcc and under the CPU shim; the torch glue (workspace allocation, device
// guard, stream, error checks) is in api.cu.
#pragma once
#include <cstdint>

#include "../params.h"
#include "bwd_dkdv_kernel.cuh"
#include "bwd_dq_kernel.cuh"
#include "bwd_row_kernels.cuh"
#include "grid.h"
#include "launch.cuh"
#include "traits.h"

namespace flashattn::cuda {

// Runs the backward for an Element (__half or __nv_bfloat16) and a head-dim tile >= p.head_dim:
//   1. D_i = rowsum(dO_i * O_i) - dLSE_i (and zero the dQ accumulator),
//   2. dK, dV (and dQ by fp32 atomics unless p.deterministic), per key tile,
//   3. dQ: the accumulator converted, or the deterministic dQ kernel.
// workspace: bwd_workspace_floats(p, kHeadDim) floats (entry.h). Calls after_launch() after
// each launch.
template <typename Element, int kHeadDim>
void run_bwd_16bit(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                   LaunchCheck after_launch) {
  using Traits = BwdTraits<kHeadDim>;
  using DqTraits = BwdDqTraits<kHeadDim>;
  const int64_t batch_heads = static_cast<int64_t>(p.batch) * p.heads_q;
  const int64_t batch_heads_kv = static_cast<int64_t>(p.batch) * p.heads_kv;
  if (batch_heads == 0) return;
  float* d_gmem = workspace;
  float* dq_accum = p.deterministic ? nullptr : workspace + dq_accum_offset(p);
  const dim3 row_grid = attention_grid(p.seqlen_q, kRowKernelWarps, batch_heads);

  if (p.seqlen_q > 0) {
    FLASHATTN_LAUNCH_KERNEL(bwd_dot_do_o_kernel<Element>, row_grid, dim3(kRowKernelThreads), 0,
                            stream, p, d_gmem, dq_accum, kHeadDim);
    after_launch();
  }
  if (p.seqlen_k > 0) {
    const dim3 grid = attention_grid(p.seqlen_k, Traits::kBlockN, batch_heads_kv);
    auto* kernel = &bwd_dkdv_kernel_16bit<Traits, Element>;
    allow_smem(kernel, Traits::kSmemBytes);
    FLASHATTN_LAUNCH_KERNEL(kernel, grid, dim3(Traits::kNThreads), Traits::kSmemBytes, stream, p,
                            d_gmem, dq_accum, kHeadDim);
    after_launch();
  }
  if (p.seqlen_q == 0) return;
  if (p.deterministic) {
    auto* kernel = &bwd_dq_kernel_16bit<DqTraits, Element>;
    allow_smem(kernel, DqTraits::kSmemBytes);
    FLASHATTN_LAUNCH_KERNEL(kernel, attention_grid(p.seqlen_q, DqTraits::kBlockM, batch_heads),
                            dim3(DqTraits::kNThreads), DqTraits::kSmemBytes, stream, p, d_gmem);
  } else {
    FLASHATTN_LAUNCH_KERNEL(bwd_convert_dq_kernel<Element>, row_grid, dim3(kRowKernelThreads), 0,
                            stream, p, dq_accum, kHeadDim);
  }
  after_launch();
}

}  // namespace flashattn::cuda
