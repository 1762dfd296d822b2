// Host side of the sm_90a forward's launch for the library: the plan's AttnParams (a call that
// plan_fwd_sm90.h accepted) as the Hopper kernel's tensor maps and FwdSm90Params, then
// hopper::launch_fwd_sm90 on the main loop of the call's features (below). Compiles under nvcc
// (inst/*_sm90.cu, for sm_90a only) and under the CPU shim (tests/sim_ext).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../params.h"
#include "grid.h"
#include "hopper/fwd_sm90_launch.h"
#include "plan_fwd_sm90.h"
#include "sm90_shared_params.h"

// The kernel uses wgmma, setmaxnreg and TMA: a device pass for any other target than sm_90a is a
// build mistake (setup.py gives inst/*_sm90.cu their own gencode), not an empty kernel.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the sm_90a forward compiles for arch=compute_90a,code=sm_90a only (kernel_list.py ARCHS)"
#endif

namespace flashattn::cuda {

namespace detail {
// One [B, S, H, D] view of AttnParams as make_fwd_sm90_maps reads it. A dimension of extent 1
// never steps its stride, which may then be 0 (a broadcast) or unaligned, and TMA would refuse
// it: it gets 16 bytes instead, `aligned` elements (8 of 16 bits, 16 of e4m3).
inline hopper::FwdSm90Input sm90_input(const TensorView& view, int batch, int64_t rows, int heads,
                                       int64_t aligned = 8) {
  const auto stride = [&](int64_t s, int64_t extent) { return extent <= 1 ? aligned : s; };
  hopper::FwdSm90Input in;
  in.ptr = view.ptr;
  in.batch_stride = stride(view.batch_stride, batch);
  in.row_stride = stride(view.row_stride, rows);
  in.head_stride = stride(view.head_stride, heads);
  in.seqlen = static_cast<int>(rows);  // < 2^31 (sm90_fwd_unsupported)
  in.heads = heads;
  return in;
}
// The kernel's parameters of p as planned, for either element type (O, the LSE, lengths, splits,
// scale, masks and their features; the FP8 descales are the FP8 launch's own).
inline hopper::FwdSm90Params sm90_params(const AttnParams& p, float* split_scratch) {
  hopper::FwdSm90Params hp;
  fill_sm90_shared_params(hp, p);
  hp.lse = static_cast<float*>(p.lse.ptr);
  hp.lse_batch_stride = p.lse.batch_stride;
  hp.lse_head_stride = p.lse.head_stride;
  // Packed GQA heads: tokens, the kernel's positions (FwdSm90Params::packed_heads).
  hp.packed_heads = p.packed_heads > 1 ? p.packed_heads : 1;
  hp.consumer_tokens = hopper::fwd_sm90_consumer_tokens(hp.packed_heads);
  hp.seqlen_q = p.seqlen_q / hp.packed_heads;
  hp.o = p.o.ptr;
  hp.o_batch_stride = p.o.batch_stride;
  hp.o_row_stride = p.o.row_stride;
  hp.o_head_stride = p.o.head_stride;
  hp.num_splits = p.num_splits > 1 ? p.num_splits : 1;
  if (hp.num_splits > 1) {
    hp.split_scratch = split_scratch;
    hp.split_o_elements = split_out_elements(p);
    hp.split_lse_elements = split_lse_elements(p);
  }
  // The sm_80 kernels' softcap (logit.cuh LogitRules): softcap * tanh(s * (scale / softcap)).
  hp.softcap = p.softcap;
  hp.scale_over_softcap = p.softcap > 0.f ? p.scale / p.softcap : 0.f;
  // A paged or indexed cache: K and V read row by row (their maps are Q's, never read).
  hp.k_cache = p.k;
  hp.v_cache = p.v;
  hp.kv_cache = p.kv_cache;
  return hp;
}

// The plain loops, for any Element (16-bit or e4m3): causal, a local window or no mask, each with
// softcap or without, each its own instantiation.
template <typename Element, int kHeadDim>
std::string launch_fwd_sm90_plain(Sm90FwdMask mask, bool softcap, const hopper::FwdSm90Maps& maps,
                                  const hopper::FwdSm90Params& hp, void* stream) {
  const auto with_softcap = [&](auto cap) {
    constexpr bool kSoftcap = decltype(cap)::value;
    switch (mask) {
      case Sm90FwdMask::kCausal:
        return hopper::launch_fwd_sm90<Element, kHeadDim, true, kSoftcap, false>(maps, hp, stream);
      case Sm90FwdMask::kLocal:
        return hopper::launch_fwd_sm90<Element, kHeadDim, false, kSoftcap, true>(maps, hp, stream);
      case Sm90FwdMask::kNone:
        break;
    }
    return hopper::launch_fwd_sm90<Element, kHeadDim, false, kSoftcap, false>(maps, hp, stream);
  };
  return softcap ? with_softcap(std::true_type{}) : with_softcap(std::false_type{});
}

// ALiBi's loops, for any Element: causal, a local window or no mask, softcap or not at run time
// inside each.
template <typename Element, int kHeadDim>
std::string launch_fwd_sm90_alibi(Sm90FwdMask mask, const hopper::FwdSm90Maps& maps,
                                  const hopper::FwdSm90Params& hp, void* stream) {
  switch (mask) {
    case Sm90FwdMask::kCausal:
      return hopper::launch_fwd_sm90<Element, kHeadDim, true, false, false, true>(maps, hp, stream);
    case Sm90FwdMask::kLocal:
      return hopper::launch_fwd_sm90<Element, kHeadDim, false, false, true, true>(maps, hp, stream);
    case Sm90FwdMask::kNone:
      break;
  }
  return hopper::launch_fwd_sm90<Element, kHeadDim, false, false, false, true>(maps, hp, stream);
}

// attn_mask's loops, for any Element: causal, a local window or no mask, softcap and ALiBi or not
// at run time inside each.
template <typename Element, int kHeadDim>
std::string launch_fwd_sm90_attn_mask(Sm90FwdMask mask, const hopper::FwdSm90Maps& maps,
                                      const hopper::FwdSm90Params& hp, void* stream) {
  switch (mask) {
    case Sm90FwdMask::kCausal:
      return hopper::launch_fwd_sm90<Element, kHeadDim, true, false, false, false, true>(maps, hp, stream);
    case Sm90FwdMask::kLocal:
      return hopper::launch_fwd_sm90<Element, kHeadDim, false, false, true, false, true>(maps, hp, stream);
    case Sm90FwdMask::kNone:
      break;
  }
  return hopper::launch_fwd_sm90<Element, kHeadDim, false, false, false, false, true>(maps, hp, stream);
}

// A gathered (paged, indexed or left-padded) KV cache's loops, for any Element: causal, a local
// window or no mask, without softcap, ALiBi or attn_mask (the masks a decode takes).
template <typename Element, int kHeadDim>
std::string launch_fwd_sm90_gather(Sm90FwdMask mask, const hopper::FwdSm90Maps& maps,
                                   const hopper::FwdSm90Params& hp, void* stream) {
  switch (mask) {
    case Sm90FwdMask::kCausal:
      return hopper::launch_fwd_sm90<Element, kHeadDim, true, false, false, false, false, true>(maps, hp, stream);
    case Sm90FwdMask::kLocal:
      return hopper::launch_fwd_sm90<Element, kHeadDim, false, false, true, false, false, true>(maps, hp, stream);
    case Sm90FwdMask::kNone:
      break;
  }
  return hopper::launch_fwd_sm90<Element, kHeadDim, false, false, false, false, false, true>(maps, hp, stream);
}
}  // namespace detail

// The main loops built for each (head dim, dtype), kernel_list.py (HEAD_DIMS_SM90_FWD): causal,
// a local window or no mask, each with softcap or without (softcap's local window at d = 256 with
// lean S descriptors: fwd_sm90_kernel.cuh kLeanDescriptors); ALiBi with causal, no mask or a
// local window, each with softcap or not at run time;
// attn_mask with no mask, causal or a local window, with softcap and ALiBi or not at run time, at
// every head dim (d = 256 with lean S descriptors: fwd_sm90_kernel.cuh kLeanDescriptors); a gathered (paged or indexed) KV cache with no mask, causal or a
// local window, without softcap, ALiBi or attn_mask, the masks a decode takes (the plan keeps the
// other combinations on sm_80: sm90_fwd_unsupported); dropout with no mask, causal or a local
// window, without softcap, ALiBi, attn_mask or a gathered cache.
template <typename Element, int kHeadDim>
std::string launch_fwd_sm90_features(const hopper::FwdSm90Maps& maps, const hopper::FwdSm90Params& hp,
                                     void* stream, bool softcap, bool alibi, bool attn_mask,
                                     Sm90FwdMask mask, bool gather_kv, bool dropout) {
  if (dropout) {
    if (softcap || alibi || attn_mask || gather_kv)
      return "dropout with softcap, ALiBi, attn_mask or a gathered KV cache is not built (the plan's mistake)";
    switch (mask) {
      case Sm90FwdMask::kCausal:
        return hopper::launch_fwd_sm90<Element, kHeadDim, true, false, false, false, false, false, true>(maps, hp, stream);
      case Sm90FwdMask::kLocal:
        return hopper::launch_fwd_sm90<Element, kHeadDim, false, false, true, false, false, false, true>(maps, hp, stream);
      case Sm90FwdMask::kNone:
        break;
    }
    return hopper::launch_fwd_sm90<Element, kHeadDim, false, false, false, false, false, false, true>(maps, hp, stream);
  }
  if (gather_kv) {
    if (softcap || alibi || attn_mask)
      return "a gathered KV cache with softcap, ALiBi or attn_mask is not built (the plan's mistake)";
    return detail::launch_fwd_sm90_gather<Element, kHeadDim>(mask, maps, hp, stream);
  }
  if (attn_mask) return detail::launch_fwd_sm90_attn_mask<Element, kHeadDim>(mask, maps, hp, stream);
  if (alibi) return detail::launch_fwd_sm90_alibi<Element, kHeadDim>(mask, maps, hp, stream);
  return detail::launch_fwd_sm90_plain<Element, kHeadDim>(mask, softcap, maps, hp, stream);
}

// Runs the sm_90a forward for an Element (__half or __nv_bfloat16) and kHeadDim == p.head_dim on
// p as planned (plan_fwd_sm90.h: sm90_fwd_unsupported(p) is nullptr). With p.num_splits > 1 it
// writes the splits' parts to split_scratch (mask.h's layout; plan.split_scratch_floats) for the
// merge the caller runs next, as run_fwd_16bit does. tile_counter: 4 bytes of device memory of
// this call's own where the walk needs one (plan_fwd.h fwd_plan_takes_tile_counter), else null.
// Calls after_launch() right after the launch.
template <typename Element, int kHeadDim>
void run_fwd_sm90(const AttnParams& p, float* split_scratch, unsigned* tile_counter, cudaStream_t stream,
                  LaunchCheck after_launch) {
  using Config = hopper::FwdSm90Config<kHeadDim>;
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>);
  const TensorMapDtype dtype =
      std::is_same_v<Element, __half> ? TensorMapDtype::Float16 : TensorMapDtype::BFloat16;
  const Sm90MapExtents extents = sm90_map_extents(p);
  const int b = extents.batch;
  hopper::FwdSm90Maps maps;
  const bool gather_kv = sm90_fwd_gathers_kv(p);
  const hopper::FwdSm90Input q_input = detail::sm90_input(p.q, b, extents.rows_q, extents.heads_q);
  const std::string maps_error = hopper::make_fwd_sm90_maps(
      maps, dtype, kHeadDim, b, q_input,
      gather_kv ? q_input : detail::sm90_input(p.k, b, extents.rows_k, p.heads_kv),
      gather_kv ? q_input : detail::sm90_input(p.v, b, extents.rows_k, p.heads_kv),
      detail::sm90_input(p.o, b, extents.rows_q, extents.heads_q), Config::kBlockM, Config::kBlockN,
      p.packed_heads);
  if (!maps_error.empty()) {
    throw std::runtime_error("flashattn: the sm_90a forward's tensor maps: " + maps_error);
  }
  hopper::FwdSm90Params hp = detail::sm90_params(p, split_scratch);
  hp.tile_counter = tile_counter;  // zeroed by the launch where the walk reads it
  const std::string launch_error = launch_fwd_sm90_features<Element, kHeadDim>(
      maps, hp, stream, p.softcap > 0.f, p.alibi.ptr != nullptr, p.mask.ptr != nullptr,
      sm90_fwd_mask(p), sm90_fwd_gathers_kv(p), p.dropout.on());
  if (!launch_error.empty()) {
    throw std::runtime_error("flashattn: the sm_90a forward's launch: " + launch_error);
  }
  after_launch();
}

// Runs the FP8 (e4m3) sm_90a forward (Element __nv_fp8_e4m3, kHeadDim 128: kernel_list.py
// fwd_sm90_fp8) on p as planned (plan_fwd_fp8.h: no mask, causal or a local window, softcap or
// not, ALiBi or not, attn_mask or not; or a paged / indexed / left-padded cache with a mask alone;
// GQA heads packed or not; split or not):
// q, k, v float8_e4m3fn, out bfloat16, the descales per (sequence, kv head) (params.h
// Fp8Descales; null: 1). With p.num_splits > 1 it writes the splits' fp32 parts to split_scratch
// (as run_fwd_sm90) for the merge the caller runs next. Calls after_launch() right after the launch.
template <typename Element, int kHeadDim>
void run_fwd_sm90_fp8(const AttnParams& p, const Fp8Descales& descales, float* split_scratch,
                      cudaStream_t stream, LaunchCheck after_launch) {
  static_assert(std::is_same_v<Element, __nv_fp8_e4m3> && kHeadDim == 128,
                "the FP8 forward is built for e4m3 at head dim 128 (fwd_sm90_config.h)");
  using Config = hopper::FwdSm90ConfigOf<Element, kHeadDim>;
  const Sm90MapExtents extents = sm90_map_extents(p);
  const int b = extents.batch;
  // TMA's 16 bytes: 16 e4m3 elements, 8 of O's bfloat16.
  constexpr int64_t kFp8Aligned = 16;
  hopper::FwdSm90Maps maps;
  // A paged or indexed cache: K and V gathered by cp.async (their maps are Q's, never read).
  const bool gather_kv = sm90_fwd_gathers_kv(p);
  const hopper::FwdSm90Input q_input = detail::sm90_input(p.q, b, extents.rows_q, extents.heads_q, kFp8Aligned);
  const std::string maps_error = hopper::make_fwd_sm90_maps(
      maps, TensorMapDtype::UInt8, kHeadDim, b, q_input,
      gather_kv ? q_input : detail::sm90_input(p.k, b, extents.rows_k, p.heads_kv, kFp8Aligned),
      gather_kv ? q_input : detail::sm90_input(p.v, b, extents.rows_k, p.heads_kv, kFp8Aligned),
      detail::sm90_input(p.o, b, extents.rows_q, extents.heads_q), Config::kBlockM, Config::kBlockN,
      p.packed_heads, TensorMapDtype::BFloat16);
  if (!maps_error.empty()) {
    throw std::runtime_error("flashattn: the sm_90a FP8 forward's tensor maps: " + maps_error);
  }
  hopper::FwdSm90Params hp = detail::sm90_params(p, split_scratch);
  hp.q_descale = static_cast<const float*>(descales.q.ptr);
  hp.q_descale_batch_stride = descales.q.batch_stride;
  hp.q_descale_head_stride = descales.q.head_stride;
  hp.k_descale = static_cast<const float*>(descales.k.ptr);
  hp.k_descale_batch_stride = descales.k.batch_stride;
  hp.k_descale_head_stride = descales.k.head_stride;
  hp.v_descale = static_cast<const float*>(descales.v.ptr);
  hp.v_descale_batch_stride = descales.v.batch_stride;
  hp.v_descale_head_stride = descales.v.head_stride;
  // Fifteen loops: no mask, causal or a local window, each with softcap or without; ALiBi's three
  // (softcap at run time); attn_mask's three (softcap and ALiBi at run time); a gathered cache's
  // three, without softcap, ALiBi or attn_mask (fp8_fwd_refusal refuses those).
  const Sm90FwdMask mask = sm90_fwd_mask(p);
  const std::string launch_error =
      gather_kv ? (p.softcap > 0.f || p.alibi.ptr != nullptr || p.mask.ptr != nullptr
                       ? std::string("a gathered FP8 KV cache with softcap, ALiBi or attn_mask is not "
                                     "built (the plan's mistake)")
                       : detail::launch_fwd_sm90_gather<Element, kHeadDim>(mask, maps, hp, stream))
      : p.mask.ptr != nullptr
          ? detail::launch_fwd_sm90_attn_mask<Element, kHeadDim>(mask, maps, hp, stream)
      : p.alibi.ptr != nullptr
          ? detail::launch_fwd_sm90_alibi<Element, kHeadDim>(mask, maps, hp, stream)
          : detail::launch_fwd_sm90_plain<Element, kHeadDim>(mask, p.softcap > 0.f, maps, hp, stream);
  if (!launch_error.empty()) {
    throw std::runtime_error("flashattn: the sm_90a FP8 forward's launch: " + launch_error);
  }
  after_launch();
}

}  // namespace flashattn::cuda
