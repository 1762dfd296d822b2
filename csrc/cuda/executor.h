// The CUDA executor of op_glue.h, written once for the GPU (api.cu) and for the CPU shim
// (tests/sim_ext/sim_ops.cpp): it plans a call (plan_fwd.h, plan_bwd.h), refuses a plan the
// device cannot hold, allocates the plan's scratch and runs the plan (launch_plan.h). What
// differs between the two is the Device policy:
//   Device::kExecutorName                       how errors name the executor
//   typename Device::Guard(at::Device)          makes q's device current during the launch
//   Device::stream(q)                           the stream to launch on
//   Device::props(q)                            what the plan needs of q's device (DeviceProps)
//   Device::check_launch()                      called after every launch
// Host code only: nvcc's device passes never see it (api.cu).
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <string>

#include "../attn_args.h"
#include "../mask.h"
#include "hopper/fwd_sm90_sms.h"
#include "launch_plan.h"
#include "plan_bwd.h"
#include "plan_fwd.h"
#include "traits.h"

namespace flashattn::cuda {

inline ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return ElementType::kHalf;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    case at::kFloat:
      return ElementType::kFloat;
    default:
      TORCH_CHECK(false, "flashattn: no CUDA kernels for dtype ", t);
  }
}

// The shared input checks keep both head dims <= kMaxHeadDim (ExecutorLimits); the kernels'
// own limits below it are checked here, before planning, each error naming the head dims: the
// fp32 SIMT kernels and the backward stop at 256, and MLA's 576 tile holds a v 512 wide
// (traits.h).
inline void check_head_dims(ElementType type, int64_t head_dim, int64_t head_dim_v,
                            bool backward) {
  const int64_t widest = std::max(head_dim, head_dim_v);
  TORCH_CHECK(type != ElementType::kFloat || widest <= kMaxHeadDimSimt,
              "flashattn: the CUDA float32 kernels support head dims <= ", kMaxHeadDimSimt,
              ", got head_dim = ", head_dim, " and head_dim_v = ", head_dim_v,
              "; float16 and bfloat16 run the forward up to 576 / 512");
  TORCH_CHECK(!backward || widest <= kMaxHeadDimBwd, "flashattn: the CUDA backward supports ",
              "head dims <= ", kMaxHeadDimBwd, ", got head_dim = ", head_dim,
              " and head_dim_v = ", head_dim_v, "; the forward runs up to 576 / 512, and the "
              "backward of wider heads on the CPU only (its tiles exceed the GPU's registers and "
              "shared memory)");
  TORCH_CHECK(head_dim_v <= kMaxHeadDimV, "flashattn: the CUDA kernels support head_dim_v <= ",
              kMaxHeadDimV, ", got head_dim_v = ", head_dim_v, " (head_dim = ", head_dim, ")");
}

// check_head_dims leaves every call a tile whose V is wide enough.
inline void check_tile(const KernelChoice& kernels, int head_dim, int head_dim_v) {
  TORCH_INTERNAL_ASSERT(kernels.head_dim_tile != 0, "flashattn: no CUDA tile for head_dim ",
                        head_dim);
  TORCH_INTERNAL_ASSERT(kernels.head_dim_v_tile >= head_dim_v,
                        "flashattn: no CUDA tile for head_dim_v ", head_dim_v);
}

// The opt-in limit differs by GPU (e.g. 99 KB on sm_86/89, 227 KB on sm_90).
inline void check_smem_fits(int needed_bytes, int limit_bytes) {
  TORCH_CHECK(needed_bytes <= limit_bytes, "flashattn: this head dim needs ", needed_bytes,
              " bytes of shared memory per block, but the GPU allows ", limit_bytes);
}

template <typename Device>
struct CudaExecutor {
  static const ExecutorLimits& limits() {
    static const ExecutorLimits cuda_limits{
        Device::kExecutorName, {at::kHalf, at::kBFloat16, at::kFloat, at::kFloat8_e4m3fn},
        kMaxHeadDim, /*reads_lengths_on_host=*/false, /*fp8_forward=*/true};
    return cuda_limits;
  }

  // FP8 inputs (fp8_args.h) take the FP8 plan; fp8 holds their descales (empty otherwise).
  static void run_fwd(const at::Tensor& q, const AttnParams& params, const Fp8Descales& fp8) {
    if (q.scalar_type() == at::kFloat8_e4m3fn) return run_fwd_fp8(q, params, fp8);
    const ElementType type = element_type(q.scalar_type());
    if (fwd_launches_nothing(params)) return;
    check_head_dims(type, params.head_dim, params.head_dim_v, /*backward=*/false);
    const typename Device::Guard guard(q.device());
    const FwdPlan plan = plan_fwd(params, type, Device::props(q));
    check_tile(plan.kernels, params.head_dim, params.head_dim_v);
    check_smem_fits(plan.shape.smem_bytes, plan.smem_limit_bytes);
    at::Tensor split_scratch = split_scratch_of(plan, q);
    // A walking sm_90a kernel's place counter (hopper/fwd_sm90_walk.h): the call's own, from the
    // caching allocator on q's device, so that launches on concurrent streams never share one;
    // the launch zeroes it on its stream. Calls whose kernel does not walk, or whose tiles are
    // no more than the SMs (one each, none from the counter), allocate nothing. The SM count is
    // the launch's own (the shim's plan device has 8 SMs, its launches cudasim::sm_count()).
    at::Tensor tile_counter;
    if (plan.kernels.arch == Arch::kSm90 && sm90_fwd_walks(plan.params) &&
        fwd_plan_takes_tile_counter(plan, hopper::fwd_sm90_sm_count()))
      tile_counter = at::empty({1}, q.options().dtype(at::kInt));
    unsigned* counter = tile_counter.defined() ? reinterpret_cast<unsigned*>(tile_counter.data_ptr<int>()) : nullptr;
    launch_fwd(plan, scratch_ptr(split_scratch), counter, Device::stream(q), &Device::check_launch);
  }

  // The fp32 scratch of a plan's split parts (plan.split_scratch_floats, on q's device), filled
  // where the plan says so; undefined for a plan that does not merge.
  static at::Tensor split_scratch_of(const FwdPlan& plan, const at::Tensor& q) {
    if (!plan.merges()) return at::Tensor();
    at::Tensor split_scratch = at::empty({plan.split_scratch_floats}, q.options().dtype(at::kFloat));
    if (plan.fill_split_scratch) {
      // The parts of out (0) and of lse (-inf).
      const int64_t outs = plan.params.num_splits * split_out_elements(plan.params);
      split_scratch.narrow(0, 0, outs).zero_();
      split_scratch.narrow(0, outs, split_scratch.numel() - outs)
          .fill_(-std::numeric_limits<float>::infinity());
    } else {
      // The tests poison it (FLASHATTN_POISON_OUTPUTS) to keep the no-fill promise true.
      poison_if_debugging(split_scratch);
    }
    return split_scratch;
  }

  static float* scratch_ptr(const at::Tensor& split_scratch) {
    return split_scratch.defined() ? split_scratch.data_ptr<float>() : nullptr;
  }

  // The FP8 forward: refused, with the plan's reason, wherever its one kernel cannot run the call
  // (device, build, opt-in, layout), even when the call is empty, so that an empty batch does
  // not hide what a full one would meet.
  static void run_fwd_fp8(const at::Tensor& q, const AttnParams& params,
                          const Fp8Descales& descales) {
    const typename Device::Guard guard(q.device());
    const DeviceProps device = Device::props(q);
    check_fp8_runs(params, device);
    const FwdPlan plan = plan_fwd_fp8(params, device);
    if (plan.empty) return;
    check_smem_fits(plan.shape.smem_bytes, plan.smem_limit_bytes);
    at::Tensor split_scratch = split_scratch_of(plan, q);
    launch_fwd_fp8(plan, descales, scratch_ptr(split_scratch), Device::stream(q),
                   &Device::check_launch);
  }

  // The FP8 forward's refusal of p on this device (plan_fwd_fp8.h fp8_fwd_refusal), if any.
  static void check_fp8_runs(const AttnParams& params, const DeviceProps& device) {
    const std::string refusal = fp8_fwd_refusal(params, device);
    TORCH_CHECK(refusal.empty(), refusal);
  }

  // What run_fwd would refuse of a call, asked by fwd_kvcache before it writes the cache: the
  // FP8 forward's refusals (its plan's; the 16-bit plans always have a kernel).
  static void check_fwd_runs(const at::Tensor& q, const AttnParams& params) {
    if (q.scalar_type() != at::kFloat8_e4m3fn) return;
    const typename Device::Guard guard(q.device());
    check_fp8_runs(params, Device::props(q));
  }

  // flash_attn_with_kvcache's append and rotary embedding, before run_fwd on the same stream.
  // FP8 caches take the e4m3 row copy (no rotary: kvcache_args.cpp).
  static void run_kv_append(const at::Tensor& q, const KvAppendParams& p) {
    const typename Device::Guard guard(q.device());
    if (q.scalar_type() == at::kFloat8_e4m3fn) {
      launch_kv_append_e4m3(p, Device::stream(q), &Device::check_launch);
      return;
    }
    launch_kv_append(p, element_type(q.scalar_type()), Device::stream(q), &Device::check_launch);
  }

  static void run_bwd(const at::Tensor& q, const AttnBwdParams& p, at::Tensor& dk,
                      at::Tensor& dv) {
    const ElementType type = element_type(q.scalar_type());
    check_head_dims(type, p.head_dim, p.head_dim_v, /*backward=*/true);
    if (bwd_launches_nothing(p)) {
      // No query head reads k and v.
      dk.zero_();
      dv.zero_();
      return;
    }
    const typename Device::Guard guard(q.device());
    const BwdPlan plan = plan_bwd(p, type, Device::props(q));
    check_tile(plan.kernels, p.head_dim, p.head_dim_v);
    check_smem_fits(plan.smem_bytes, plan.smem_limit_bytes);
    at::Tensor workspace = at::empty({plan.workspace_floats}, q.options().dtype(at::kFloat));
    // The kernels must not depend on the scratch's initial contents: tests poison it too.
    poison_if_debugging(workspace);
    launch_bwd(plan, p, workspace.data_ptr<float>(), Device::stream(q), &Device::check_launch);
  }
};

}  // namespace flashattn::cuda
