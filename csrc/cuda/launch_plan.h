// Executes plans (plan_fwd.h, plan_bwd.h), written once for api.cu and for the CPU-shim test
// extension: the plan's element type and head-dim tile pick the launch template (kernels.h)
// that inst/*.cu instantiates, which runs the plan's kernels.
#pragma once
#include <cuda_fp8.h>

#include <stdexcept>
#include <type_traits>

#include "../params.h"
#include "dispatch.h"
#include "grid.h"
#include "kernels.h"
#include "plan_bwd.h"
#include "plan_fwd.h"
#include "plan_fwd_fp8.h"

namespace flashattn::cuda {

// Calls f(Element{}, std::integral_constant<int, tile>{}, std::integral_constant<int, tile_v>{})
// for a choice with a tile, among the forward's tiles or the backward's (kBackward).
template <bool kBackward = false, typename F>
void dispatch_choice(const KernelChoice& choice, F&& f) {
  dispatch_element(choice.type, [&](auto element) {
    dispatch_head_dims(HeadDimTilesFor<decltype(element), kBackward>{}, choice.head_dim_tile,
                       choice.head_dim_v_tile,
                       [&](auto tile, auto tile_v) { f(element, tile, tile_v); });
  });
}

// Runs the kernel of a plan of the sm_90a forward (plan_fwd_sm90.h): 16-bit, its tile the head
// dim; split_scratch and tile_counter as for launch_fwd.
inline void launch_fwd_sm90(const FwdPlan& plan, float* split_scratch, unsigned* tile_counter, cudaStream_t stream,
                            LaunchCheck after_launch) {
  bool launched = false;
  dispatch_element(plan.kernels.type, [&](auto element) {
    using Element = decltype(element);
    // Not instantiated where the kernels are not built, so nothing refers to them there.
    if constexpr (kSm90KernelsBuilt && !std::is_same_v<Element, float>) {
      launched = dispatch_head_dim(Sm90FwdHeadDims{}, plan.kernels.head_dim_tile, [&](auto tile) {
        run_fwd_sm90<Element, decltype(tile)::value>(plan.params, split_scratch, tile_counter, stream, after_launch);
      });
    }
  });
  // The plan chooses the kernels only where they are built (sm90_fwd_enabled).
  if (!launched) throw std::logic_error("flashattn: a plan for sm_90a kernels this build lacks");
}

// Runs the split merge of a plan that has one (FwdPlan::merges), after its kernel on `stream`.
// The merge walks out's rows as they are: unpacked (gqa_decode.h). The same for every kernel.
inline void launch_fwd_merge(const FwdPlan& plan, const float* split_scratch, cudaStream_t stream,
                             LaunchCheck after_launch) {
  if (!plan.merges()) return;
  // out is float32 when the inputs are (the SIMT kernels) or when out_fp32 asks for it; the FP8
  // plan's type is its out's, bfloat16.
  const ElementType out_type = plan.params.out_fp32 ? ElementType::kFloat : plan.kernels.type;
  dispatch_element(out_type, [&](auto element) {
    run_split_merge<decltype(element)>(plan.merge_params, split_scratch, stream, after_launch);
  });
}

// Runs an FP8 forward plan (plan_fwd_fp8.h) that is not empty: the e4m3 kernel with the descales,
// then its split merge if it has one; split_scratch as for launch_fwd.
inline void launch_fwd_fp8(const FwdPlan& plan, const Fp8Descales& descales, float* split_scratch,
                           cudaStream_t stream, LaunchCheck after_launch) {
  // Not instantiated where the kernels are not built (fp8_fwd_refusal refuses every call there).
  if constexpr (kSm90KernelsBuilt) {
    run_fwd_sm90_fp8<__nv_fp8_e4m3, 128>(plan.params, descales, split_scratch, stream,
                                         after_launch);
    launch_fwd_merge(plan, split_scratch, stream, after_launch);
  } else {
    (void)plan, (void)descales, (void)split_scratch, (void)stream, (void)after_launch;
    throw std::logic_error("flashattn: a plan for the FP8 kernel this build lacks");
  }
}

// Runs a forward plan that is not empty on `stream`, then its split merge if it has one.
// split_scratch: plan.split_scratch_floats floats (null when 0). tile_counter: 4 bytes of device
// memory of this call's own where the plan's kernel walks past its grid (plan_fwd.h
// fwd_plan_takes_tile_counter); else null.
inline void launch_fwd(const FwdPlan& plan, float* split_scratch, unsigned* tile_counter, cudaStream_t stream,
                       LaunchCheck after_launch) {
  if (plan.kernels.arch == Arch::kSm90) {
    launch_fwd_sm90(plan, split_scratch, tile_counter, stream, after_launch);
  } else {
    dispatch_choice(plan.kernels, [&](auto element, auto tile, auto tile_v) {
      using Element = decltype(element);
      constexpr int kTile = decltype(tile)::value;
      if constexpr (std::is_same_v<Element, float>) {
        run_fwd_simt<kTile>(plan.params, split_scratch, stream, after_launch);
      } else {
        run_fwd_16bit<Element, kTile, decltype(tile_v)::value>(plan.params, split_scratch, stream,
                                                               after_launch);
      }
    });
  }
  launch_fwd_merge(plan, split_scratch, stream, after_launch);
}

// Runs a plan of the sm_90a backward (plan_bwd_sm90.h): 16-bit, its tile the head dim.
inline void launch_bwd_sm90(const BwdPlan& plan, const AttnBwdParams& p, float* workspace,
                            cudaStream_t stream, LaunchCheck after_launch) {
  bool launched = false;
  dispatch_element(plan.kernels.type, [&](auto element) {
    using Element = decltype(element);
    if constexpr (kSm90KernelsBuilt && !std::is_same_v<Element, float>) {
      launched = dispatch_head_dim(Sm90BwdHeadDims{}, plan.kernels.head_dim_tile, [&](auto tile) {
        run_bwd_sm90<Element, decltype(tile)::value>(p, workspace, stream, after_launch);
      });
    }
  });
  if (!launched) throw std::logic_error("flashattn: a plan for sm_90a kernels this build lacks");
}

// Runs a backward plan that is not empty; workspace: plan.workspace_floats floats.
inline void launch_bwd(const BwdPlan& plan, const AttnBwdParams& p, float* workspace,
                       cudaStream_t stream, LaunchCheck after_launch) {
  if (plan.kernels.arch == Arch::kSm90) {
    launch_bwd_sm90(plan, p, workspace, stream, after_launch);
    return;
  }
  dispatch_choice</*kBackward=*/true>(plan.kernels, [&](auto element, auto tile, auto tile_v) {
    using Element = decltype(element);
    constexpr int kTile = decltype(tile)::value;
    if constexpr (std::is_same_v<Element, float>) {
      run_bwd_simt<kTile>(p, workspace, stream, after_launch);
    } else {
      run_bwd_16bit<Element, kTile, decltype(tile_v)::value>(p, workspace, stream, after_launch);
    }
  });
}

// Appends to a KV cache and applies rotary embeddings (kv_append_kernel.cuh).
inline void launch_kv_append(const KvAppendParams& p, ElementType type, cudaStream_t stream,
                             LaunchCheck after_launch) {
  dispatch_element(type, [&](auto element) {
    run_kv_append<decltype(element)>(p, stream, after_launch);
  });
}

// Appends e4m3 rows to an FP8 KV cache (kv_append_kernel.cuh): a copy of each row's bytes;
// rotary is refused for FP8 (kvcache_args.cpp), so no element is converted.
inline void launch_kv_append_e4m3(const KvAppendParams& p, cudaStream_t stream,
                                  LaunchCheck after_launch) {
  run_kv_append<__nv_fp8_e4m3>(p, stream, after_launch);
}

}  // namespace flashattn::cuda
