// Host side of the sm_90a backward's launch for the library: the plan's AttnBwdParams (a call that
// plan_bwd_sm90.h accepted) as the Hopper kernels' tensor maps, BwdSm90Params and BwdSm90Rows (its
// own TensorViews),
// the workspace bound, then hopper::launch_bwd_sm90 (rows, main, convert kernels) with the main
// loop for its mask (none, causal, a local window), ALiBi and softcap. Compiles under nvcc (inst/*_sm90.cu, for sm_90a only) and under the CPU shim
// (tests/sim_ext).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "../params.h"
#include "grid.h"
#include "kernels.h"
#include "hopper/bwd_sm90_launch.h"
#include "plan_bwd_sm90.h"

// As launch_fwd_sm90.cuh: a device pass for any other target than sm_90a is a build mistake.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the sm_90a backward compiles for arch=compute_90a,code=sm_90a only (kernel_list.py ARCHS)"
#endif

namespace flashattn::cuda {

// The main loops built for each (head dim, dtype), kernel_list.py (bwd_sm90): no mask, causal
// or a local window (the forward's classification, sm90_fwd_mask), each with softcap or without;
// ALiBi with no mask, causal or a local window, softcap or not at run time where
// hopper::bwd_sm90_alibi_takes_softcap (d = 128), else with softcap in loops of its own (d = 64);
// attn_mask with no mask, causal or a local window, ALiBi or not at run time, each with softcap or
// not (at d = 128 the softcap ones in files of their own: hopper::bwd_sm90_attn_mask_softcap_apart,
// launch_bwd_sm90_mask_softcap.cuh; the mask's gradient stays on sm_80); dropout with no mask,
// causal or a local window, without ALiBi, softcap or attn_mask (as the forward), at d = 64
// without the local window (hopper::bwd_sm90_builds_dropout).
// The attn_mask main loop for the mask, with softcap or without (kSoftcap); ALiBi at run time.
template <typename Element, int kHeadDim, bool kSoftcap>
std::string launch_bwd_sm90_attn_mask(const hopper::BwdSm90Maps& maps, const hopper::BwdSm90Params& hp,
                                      const hopper::BwdSm90Rows& rows, void* stream, Sm90FwdMask mask) {
  switch (mask) {
    case Sm90FwdMask::kCausal:
      return hopper::launch_bwd_sm90<Element, kHeadDim, true, false, false, kSoftcap, true>(maps, hp, rows, stream);
    case Sm90FwdMask::kLocal:
      return hopper::launch_bwd_sm90<Element, kHeadDim, false, true, false, kSoftcap, true>(maps, hp, rows, stream);
    case Sm90FwdMask::kNone:
      break;
  }
  return hopper::launch_bwd_sm90<Element, kHeadDim, false, false, false, kSoftcap, true>(maps, hp, rows, stream);
}

template <typename Element, int kHeadDim>
std::string launch_bwd_sm90_masks(const hopper::BwdSm90Maps& maps, const hopper::BwdSm90Params& hp,
                                  const hopper::BwdSm90Rows& rows, void* stream, Sm90FwdMask mask, bool alibi,
                                  bool softcap, bool attn_mask, bool dropout) {
  if (dropout) {
    if constexpr (!hopper::bwd_sm90_builds_dropout(kHeadDim, false)) {
      return std::string("dropout is not built at this head dim (the plan's mistake)");
    } else {
      if (alibi || softcap || attn_mask) return "dropout with ALiBi, softcap or attn_mask is not built (the plan's mistake)";
      switch (mask) {
        case Sm90FwdMask::kCausal:
          return hopper::launch_bwd_sm90<Element, kHeadDim, true, false, false, false, false, true>(maps, hp, rows, stream);
        case Sm90FwdMask::kLocal:
          if constexpr (hopper::bwd_sm90_builds_dropout(kHeadDim, true)) {
            return hopper::launch_bwd_sm90<Element, kHeadDim, false, true, false, false, false, true>(maps, hp, rows,
                                                                                                      stream);
          } else {
            return std::string("dropout with a local window is not built at this head dim (the plan's mistake)");
          }
        case Sm90FwdMask::kNone:
          break;
      }
      return hopper::launch_bwd_sm90<Element, kHeadDim, false, false, false, false, false, true>(maps, hp, rows, stream);
    }
  }
  if (attn_mask) {
    // ALiBi at run time, inside each attn_mask loop; softcap in loops of their own.
    if (softcap) {
      if constexpr (hopper::bwd_sm90_attn_mask_softcap_apart(kHeadDim)) {
        return std::string("attn_mask with softcap runs from its own file at this head dim (the caller's mistake)");
      } else {
        return launch_bwd_sm90_attn_mask<Element, kHeadDim, true>(maps, hp, rows, stream, mask);
      }
    }
    return launch_bwd_sm90_attn_mask<Element, kHeadDim, false>(maps, hp, rows, stream, mask);
  }
  if (alibi) {
    // At d = 64 ALiBi with softcap has loops of its own (kAlibi and kSoftcap).
    if constexpr (!hopper::bwd_sm90_alibi_takes_softcap(kHeadDim)) {
      if (softcap) {
        switch (mask) {
          case Sm90FwdMask::kCausal:
            return hopper::launch_bwd_sm90<Element, kHeadDim, true, false, true, true>(maps, hp, rows, stream);
          case Sm90FwdMask::kLocal:
            return hopper::launch_bwd_sm90<Element, kHeadDim, false, true, true, true>(maps, hp, rows, stream);
          case Sm90FwdMask::kNone:
            break;
        }
        return hopper::launch_bwd_sm90<Element, kHeadDim, false, false, true, true>(maps, hp, rows, stream);
      }
    }
    // Softcap or not at run time, inside each ALiBi loop (at d = 64 without).
    switch (mask) {
      case Sm90FwdMask::kCausal:
        return hopper::launch_bwd_sm90<Element, kHeadDim, true, false, true>(maps, hp, rows, stream);
      case Sm90FwdMask::kLocal:
        return hopper::launch_bwd_sm90<Element, kHeadDim, false, true, true>(maps, hp, rows, stream);
      case Sm90FwdMask::kNone:
        break;
    }
    return hopper::launch_bwd_sm90<Element, kHeadDim, false, false, true>(maps, hp, rows, stream);
  }
  const auto with_softcap = [&](auto cap) {
    constexpr bool kSoftcap = decltype(cap)::value;
    switch (mask) {
      case Sm90FwdMask::kCausal:
        return hopper::launch_bwd_sm90<Element, kHeadDim, true, false, false, kSoftcap>(maps, hp, rows, stream);
      case Sm90FwdMask::kLocal:
        return hopper::launch_bwd_sm90<Element, kHeadDim, false, true, false, kSoftcap>(maps, hp, rows, stream);
      case Sm90FwdMask::kNone:
        break;
    }
    return hopper::launch_bwd_sm90<Element, kHeadDim, false, false, false, kSoftcap>(maps, hp, rows, stream);
  };
  return softcap ? with_softcap(std::true_type{}) : with_softcap(std::false_type{});
}

// What the sm_90a backward's launches take for a call: its tensor maps, parameters and row views.
struct BwdSm90Launch {
  hopper::BwdSm90Maps maps;
  hopper::BwdSm90Params hp;
  hopper::BwdSm90Rows rows;
};

// p (a call plan_bwd_sm90.h accepted) as BwdSm90Launch, with the workspace (the plan's
// workspace_floats, hopper::bwd_sm90_workspace_floats, 16-byte aligned) bound.
template <typename Element, int kHeadDim>
BwdSm90Launch make_bwd_sm90_launch(const AttnBwdParams& p, float* workspace) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>);
  const TensorMapDtype dtype =
      std::is_same_v<Element, __half> ? TensorMapDtype::Float16 : TensorMapDtype::BFloat16;
  // Dense: (B, S) rows; varlen: the packed rows as one batch (plan_fwd_sm90.h).
  const Sm90MapExtents extents = sm90_map_extents(p);
  const int b = extents.batch;
  BwdSm90Launch launch{{}, make_bwd_sm90_params(p), {p.o, p.dout, p.lse, p.dq}};
  const std::string maps_error = hopper::make_bwd_sm90_maps<kHeadDim>(
      launch.maps, dtype, b, hopper::bshd_tensor(p.q, b, extents.rows_q, p.heads_q),
      hopper::bshd_tensor(p.k, b, extents.rows_k, p.heads_kv),
      hopper::bshd_tensor(p.v, b, extents.rows_k, p.heads_kv),
      hopper::bshd_tensor(p.dout, b, extents.rows_q, p.heads_q));
  if (!maps_error.empty()) {
    throw std::runtime_error("flashattn: the sm_90a backward's tensor maps: " + maps_error);
  }
  hopper::bwd_sm90_bind_workspace<kHeadDim>(launch.hp, workspace);
  return launch;
}

inline void check_bwd_sm90_launch(const std::string& launch_error) {
  if (!launch_error.empty()) {
    throw std::runtime_error("flashattn: the sm_90a backward's launch: " + launch_error);
  }
}

// Runs the sm_90a backward for an Element (__half or __nv_bfloat16) and kHeadDim == p.head_dim
// on p as planned (plan_bwd_sm90.h: sm90_bwd_unsupported(p) is nullptr). workspace: the plan's
// workspace_floats (hopper::bwd_sm90_workspace_floats), 16-byte aligned. Calls after_launch()
// after the three launches. attn_mask with softcap where its loops are built apart goes to
// run_bwd_sm90_mask_softcap (kernels.h), defined in that file alone.
template <typename Element, int kHeadDim>
void run_bwd_sm90(const AttnBwdParams& p, float* workspace, cudaStream_t stream,
                  LaunchCheck after_launch) {
  if constexpr (hopper::bwd_sm90_attn_mask_softcap_apart(kHeadDim)) {
    if (p.mask.ptr != nullptr && p.softcap > 0.f) {
      run_bwd_sm90_mask_softcap<Element, kHeadDim>(p, workspace, stream, after_launch);
      return;
    }
  }
  const BwdSm90Launch l = make_bwd_sm90_launch<Element, kHeadDim>(p, workspace);
  check_bwd_sm90_launch(launch_bwd_sm90_masks<Element, kHeadDim>(
      l.maps, l.hp, l.rows, stream, sm90_fwd_mask(p), l.hp.alibi_slopes != nullptr, l.hp.softcap > 0.f,
      l.hp.attn_mask.ptr != nullptr, l.hp.dropout.on()));
  after_launch();
}

}  // namespace flashattn::cuda
