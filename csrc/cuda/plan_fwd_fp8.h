// The plan of an FP8 forward call (fp8_args.h: float8_e4m3fn q, k, v at head dim 128, no mask,
// causal or a sliding window, softcap or not, ALiBi or not, none of the features the FP8 kernel
// lacks), written once for the executor and its tests.
// Host only and free of CUDA calls, like plan_fwd.h.
//
// There is one FP8 kernel, the sm_90a e4m3 forward (run_fwd_sm90_fp8, kernel_list.py
// fwd_sm90_fp8), and no sm_80 one to fall back to: where it cannot run the call, the plan says why
// (fp8_fwd_refusal) and the executor refuses the call with that error, never running another kernel.
#pragma once
#include <string>

#include "../params.h"
#include "plan_fwd.h"
#include "plan_fwd_sm90.h"

namespace flashattn::cuda {

// The head dims the FP8 kernel is compiled for (kernel_list.py HEAD_DIMS_SM90_FP8).
using Sm90FwdFp8HeadDims = HeadDimTilesOf<kSm90aFwdSm90Fp8HeadDims>;
using Fp8FwdConfig = hopper::FwdSm90Config<128, /*kGatherKv=*/false, /*kElemBytes=*/1>;
// A paged, indexed or left-padded cache's (sm90_fwd_gathers_kv): the gathering ring's 3 stages.
using Fp8GatherFwdConfig = hopper::FwdSm90Config<128, /*kGatherKv=*/true, /*kElemBytes=*/1>;

namespace detail {
// TMA reads e4m3 rows through 16-byte aligned addresses and strides: multiples of 16 elements.
inline bool fp8_tma_view_ok(const TensorView& view, int batch, int64_t rows, int heads) {
  const auto ok = [](int64_t stride, int64_t extent) {
    return extent <= 1 || (stride > 0 && stride % 16 == 0 && stride < (int64_t{1} << 40));
  };
  return reinterpret_cast<std::uintptr_t>(view.ptr) % 16 == 0 && rows < (int64_t{1} << 31) &&
         ok(view.row_stride, rows) && ok(view.head_stride, heads) && ok(view.batch_stride, batch);
}
}  // namespace detail

// Why the FP8 forward cannot run p (make_fwd_params of an FP8 call that fp8_args.cpp accepted) on
// `device`, or "" when it can: the device, the build and the opt-in first, then the layouts.
inline std::string fp8_fwd_refusal(const AttnParams& p, const DeviceProps& device) {
  const std::string who = "flashattn: float8_e4m3fn (FP8) inputs run the sm_90a FP8 forward, ";
  if (!kSm90KernelsBuilt)
    return who + "which this build lacks (built without 90 in FLASHATTN_CUDA_ARCHS)";
  if (device.cc_major != 9 || device.cc_minor != 0)
    return who + "which needs a compute capability 9.0 GPU (H100, H200); this one is " +
           std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor);
  if (!device.hopper_fwd)
    return who + "which is opt-in until confirmed on a GPU: set " + kHopperOptInVariable + "=1";
  bool built = false;
  dispatch_head_dim(Sm90FwdFp8HeadDims{}, p.head_dim,
                    [&](auto tile) { built = decltype(tile)::value == p.head_dim; });
  if (!built || p.head_dim_v != p.head_dim)
    return who + "which is built for head dim 128 only, got " + std::to_string(p.head_dim);
  if (!(p.scale > 0.f)) return who + "which needs a positive softmax_scale";
  if (p.heads_q > 65535 || p.batch > 65535)
    return who + "which takes at most 65535 heads and batches";
  const Sm90MapExtents maps = sm90_map_extents(p);
  const bool gathers = sm90_fwd_gathers_kv(p);
  // A paged, indexed or left-padded cache: the gathering loops take a mask alone (fp8_args.cpp
  // refuses the rest by name first; this is the plan's own guard).
  if (gathers && (p.softcap > 0.f || p.alibi.ptr != nullptr || p.mask.ptr != nullptr))
    return who + "whose paged or indexed KV cache loops take no softcap, ALiBi or attn_mask";
  // Its 16-byte cp.async reads 16 e4m3 elements from 16-byte aligned rows.
  const auto cp_async_ok = [](const TensorView& view) {
    return detail::cp_async_view_ok(view) && view.batch_stride % 16 == 0 && view.row_stride % 16 == 0 &&
           view.head_stride % 16 == 0;
  };
  if (gathers && (!cp_async_ok(p.k) || !cp_async_ok(p.v)))
    return who + "whose paged or indexed KV cache reads need k_cache and v_cache 16-byte aligned, "
           "with strides (of their pages or entries, rows and heads) that are multiples of 16 elements";
  if (!detail::fp8_tma_view_ok(p.q, maps.batch, maps.rows_q, maps.heads_q) ||
      (!gathers && (!detail::fp8_tma_view_ok(p.k, maps.batch, maps.rows_k, p.heads_kv) ||
                    !detail::fp8_tma_view_ok(p.v, maps.batch, maps.rows_k, p.heads_kv))))
    return who + "whose TMA loads need q, k and v 16-byte aligned, with strides (of their "
           "rows, heads and batches) that are multiples of 16 elements";
  if (!detail::tma_view_ok(p.o, maps.batch, maps.rows_q, maps.heads_q) || p.lse.row_stride != 1)
    return "flashattn: the FP8 forward's out and lse are its own allocations (the op's mistake)";
  return "";
}

// The FP8 forward's plan of p, which fp8_fwd_refusal accepted: one launch of the e4m3 kernel's
// geometry, with the 16-bit sm_90a plan's two decode decisions (plan_fwd.h plan_fwd): a GQA
// decode's query heads packed into its kv head's tile where the 16-bit plan packs them
// (gqa_decode.h; above 64 heads per kv head, which the kernel's tile cannot hold, unpacked: FP8
// has no sm_80 kernel to leave it to), and split-KV as p.num_splits asks (0: the split model on
// the e4m3 kernel's shape), the splits' fp32 parts merged into the bfloat16 out.
inline FwdPlan plan_fwd_fp8(const AttnParams& params, const DeviceProps& device) {
  FwdPlan plan;
  plan.device_arch = device_arch(device);
  // The element of out, bfloat16, which names the split merge's type.
  plan.kernels = {KernelFamily::kTensorCore, Arch::kSm90, ElementType::kBFloat16, 128, 128};
  plan.fp8 = true;
  plan.smem_limit_bytes = device.smem_optin_bytes;
  plan.params = params;
  plan.merge_params = params;
  plan.empty = fwd_launches_nothing(params);
  const AttnParams packed = pack_gqa_decode(params);
  if (sm90_fwd_takes_packed_heads(packed)) plan.params = packed;
  plan_sm90_fwd_launch<Fp8FwdConfig>(plan, params.num_splits, device.sm_count,
                                     sm90_fwd_gathers_kv(params) ? Fp8GatherFwdConfig::kSmemBytes
                                                                 : Fp8FwdConfig::kSmemBytes);
  plan_split_scratch(plan);
  return plan;
}

}  // namespace flashattn::cuda
