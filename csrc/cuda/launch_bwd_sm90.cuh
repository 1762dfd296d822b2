// Host side of the sm_90a backward's launch for the library: the plan's AttnBwdParams (a call that
// plan_bwd_sm90.h accepted) as the Hopper kernels' tensor maps, BwdSm90Params and BwdSm90Rows,
// the workspace bound, then hopper::launch_bwd_sm90 (rows, main, convert kernels) with the causal
// mask or without. Compiles under nvcc (inst/*_sm90.cu, for sm_90a only) and under the CPU shim
// (tests/sim_ext).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "../params.h"
#include "grid.h"
#include "hopper/bwd_sm90_launch.h"
#include "launch_fwd_sm90.cuh"  // detail::sm90_input: one [B, S, H, D] view as TMA reads it
#include "plan_bwd_sm90.h"

// As launch_fwd_sm90.cuh: a device pass for any other target than sm_90a is a build mistake.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the sm_90a backward compiles for arch=compute_90a,code=sm_90a only (kernel_list.py ARCHS)"
#endif

namespace flashattn::cuda {

// Runs the sm_90a backward for an Element (__half or __nv_bfloat16) and kHeadDim == p.head_dim
// on p as planned (plan_bwd_sm90.h: sm90_bwd_unsupported(p) is nullptr). workspace: the plan's
// workspace_floats (hopper::bwd_sm90_workspace_floats), 16-byte aligned. Calls after_launch()
// after the three launches.
template <typename Element, int kHeadDim>
void run_bwd_sm90(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                  LaunchCheck after_launch) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>);
  const TensorMapDtype dtype =
      std::is_same_v<Element, __half> ? TensorMapDtype::Float16 : TensorMapDtype::BFloat16;
  const int b = p.batch;
  hopper::BwdSm90Maps maps;
  const std::string maps_error = hopper::make_bwd_sm90_maps<kHeadDim>(
      maps, dtype, b, detail::sm90_input(p.q, b, p.seqlen_q, p.heads_q),
      detail::sm90_input(p.k, b, p.seqlen_k, p.heads_kv),
      detail::sm90_input(p.v, b, p.seqlen_k, p.heads_kv),
      detail::sm90_input(p.dout, b, p.seqlen_q, p.heads_q));
  if (!maps_error.empty()) {
    throw std::runtime_error("flashattn: the sm_90a backward's tensor maps: " + maps_error);
  }
  hopper::BwdSm90Params hp = make_bwd_sm90_params(p);
  hopper::bwd_sm90_bind_workspace<kHeadDim>(hp, workspace);
  hopper::BwdSm90Rows rows;
  rows.o = p.o.ptr;
  rows.o_batch_stride = p.o.batch_stride;
  rows.o_row_stride = p.o.row_stride;
  rows.o_head_stride = p.o.head_stride;
  rows.dout = p.dout.ptr;
  rows.do_batch_stride = p.dout.batch_stride;
  rows.do_row_stride = p.dout.row_stride;
  rows.do_head_stride = p.dout.head_stride;
  rows.lse = static_cast<const float*>(p.lse.ptr);
  rows.lse_batch_stride = p.lse.batch_stride;
  rows.lse_head_stride = p.lse.head_stride;
  rows.dq = p.dq.ptr;
  rows.dq_batch_stride = p.dq.batch_stride;
  rows.dq_row_stride = p.dq.row_stride;
  rows.dq_head_stride = p.dq.head_stride;
  // The plan sends no window here but causal's (-1, 0).
  const bool causal = p.window_right == 0;
  const std::string launch_error =
      causal ? hopper::launch_bwd_sm90<Element, kHeadDim, true>(maps, hp, rows, stream)
             : hopper::launch_bwd_sm90<Element, kHeadDim, false>(maps, hp, rows, stream);
  if (!launch_error.empty()) {
    throw std::runtime_error("flashattn: the sm_90a backward's launch: " + launch_error);
  }
  after_launch();
}

}  // namespace flashattn::cuda
