// The backward's launch decisions, all in one place: which kernels run (plan_fwd.h's choice:
// family, architecture, head-dim tile; the sm_90a backward where plan_bwd_sm90.h allows), how dQ
// is summed (fp32 atomics into a workspace, or the
// deterministic dQ kernel), the workspace, and each launch's grid, block and shared memory.
// Host only and free of CUDA calls, like plan_fwd.h. executor.h plans, allocates and checks;
// launch_bwd.cuh and launch_simt.cuh execute the steps (bwd_steps_*), which they compute from
// the same functions, since inst/*.cu instantiates them with the parameters only.
#pragma once
#include <cstdint>
#include <type_traits>

#include "../params.h"
#include "grid.h"
#include "plan_bwd_sm90.h"
#include "plan_fwd.h"
#include "traits.h"

namespace flashattn::cuda {

// The backward's kernels, in the order they run. The family of a step says which kernel:
//   kDotDoO     D_i = rowsum(dO_i * O_i) - dLSE_i, and zeroes the dQ accumulator (row kernel);
//   kDkdv       dK, dV per key tile (tensor cores: and dQ by fp32 atomics, unless
//               deterministic; SIMT: one warp per key row);
//   kDq         dQ per query tile (tensor cores: the deterministic dQ kernel; SIMT: one warp
//               per query row);
//   kConvertDq  the fp32 dQ accumulator into dq (row kernel; tensor cores only).
enum class BwdKernel { kDotDoO, kDkdv, kDq, kConvertDq };

struct BwdStep {
  BwdKernel kernel;
  KernelFamily family;
  dim3 grid;
  dim3 block;
  int smem_bytes;
};

// A backward's launches, at most three: D_i (when Sq > 0), dK/dV (when Sk > 0), dQ (when
// Sq > 0).
struct BwdSteps {
  static constexpr int kMaxSteps = 3;
  BwdStep step[kMaxSteps];
  int count = 0;

  void add(const BwdStep& s) { step[count++] = s; }
  const BwdStep* begin() const { return step; }
  const BwdStep* end() const { return step + count; }
};

// Whether dQ is summed by fp32 atomics into the workspace (then converted by a row kernel):
// the tensor-core backward unless deterministic. The SIMT backward sums in a fixed order.
inline bool bwd_dq_accum(const AttnBwdParams& p, KernelFamily family) {
  return family == KernelFamily::kTensorCore && !p.deterministic;
}

// Where the backward's fp32 dQ accumulator starts in its workspace (bwd_workspace_floats):
// after D_i's rows (heads_q x total_q floats), rounded up to an even count so that the dK/dV
// kernel's 8-byte reductions are aligned.
inline int64_t dq_accum_offset(const AttnBwdParams& p) {
  const int64_t d_rows = static_cast<int64_t>(p.heads_q) * p.total_q;
  return d_rows + d_rows % 2;
}

// The D_i kernel and the dQ conversion: one warp per query row.
inline BwdStep bwd_row_step(BwdKernel kernel, const AttnBwdParams& p) {
  const int64_t batch_heads = static_cast<int64_t>(p.batch) * p.heads_q;
  return {kernel, KernelFamily::kRows, attention_grid(p.seqlen_q, kRowKernelWarps, batch_heads),
          dim3(kRowKernelThreads), 0};
}

// The tensor-core backward's launches for p (head-dim tile (kHeadDim, kHeadDimV)).
template <int kHeadDim, int kHeadDimV>
BwdSteps bwd_steps_16bit(const AttnBwdParams& p) {
  using Traits = BwdTile<kHeadDim, kHeadDimV>;
  using DqTraits = BwdDqTile<kHeadDim, kHeadDimV>;
  BwdSteps steps;
  const int64_t batch_heads = static_cast<int64_t>(p.batch) * p.heads_q;
  if (batch_heads == 0) return steps;
  if (p.seqlen_q > 0) steps.add(bwd_row_step(BwdKernel::kDotDoO, p));
  if (p.seqlen_k > 0) {
    steps.add({BwdKernel::kDkdv, KernelFamily::kTensorCore,
               attention_grid(p.seqlen_k, Traits::kBlockN,
                              static_cast<int64_t>(p.batch) * p.heads_kv),
               dim3(Traits::kNThreads), Traits::kSmemBytes});
  }
  if (p.seqlen_q == 0) return steps;
  if (bwd_dq_accum(p, KernelFamily::kTensorCore)) {
    steps.add(bwd_row_step(BwdKernel::kConvertDq, p));
  } else {
    steps.add({BwdKernel::kDq, KernelFamily::kTensorCore,
               attention_grid(p.seqlen_q, DqTraits::kBlockM, batch_heads),
               dim3(DqTraits::kNThreads), DqTraits::kSmemBytes});
  }
  return steps;
}

// The SIMT backward's launches for p (head-dim tile kHeadDim): a CTA's warps take one key row
// (dK/dV) or one query row (dQ) each.
template <int kHeadDim>
BwdSteps bwd_steps_simt(const AttnBwdParams& p) {
  using Traits = SimtTraits<kHeadDim>;
  BwdSteps steps;
  const int64_t batch_heads = static_cast<int64_t>(p.batch) * p.heads_q;
  if (batch_heads == 0) return steps;
  if (p.seqlen_q > 0) steps.add(bwd_row_step(BwdKernel::kDotDoO, p));
  if (p.seqlen_k > 0) {
    steps.add({BwdKernel::kDkdv, KernelFamily::kSimt,
               attention_grid(p.seqlen_k, Traits::kNWarps,
                              static_cast<int64_t>(p.batch) * p.heads_kv),
               dim3(Traits::kNThreads), Traits::kDkdvSmemBytes});
  }
  if (p.seqlen_q > 0) {
    steps.add({BwdKernel::kDq, KernelFamily::kSimt,
               attention_grid(p.seqlen_q, Traits::kNWarps, batch_heads), dim3(Traits::kNThreads),
               Traits::kSmemBytes});
  }
  return steps;
}

// Largest dynamic shared memory any kernel of the backward asks for, whether this call runs it
// or not (the deterministic dQ kernel's too): the check does not depend on the flag.
inline int bwd_smem_bytes(const KernelChoice& choice) {
  int bytes = 0;
  dispatch_element(choice.type, [&](auto element) {
    using Element = decltype(element);
    dispatch_head_dims(HeadDimTilesFor<Element, true>{}, choice.head_dim_tile,
                       choice.head_dim_v_tile, [&](auto tile, auto tile_v) {
      constexpr int kTile = decltype(tile)::value;
      constexpr int kTileV = decltype(tile_v)::value;
      if constexpr (std::is_same_v<Element, float>) {
        bytes = SimtTraits<kTile>::kDkdvSmemBytes > SimtTraits<kTile>::kSmemBytes
                    ? SimtTraits<kTile>::kDkdvSmemBytes
                    : SimtTraits<kTile>::kSmemBytes;
      } else {
        using Traits = BwdTile<kTile, kTileV>;
        using DqTraits = BwdDqTile<kTile, kTileV>;
        bytes = Traits::kSmemBytes > DqTraits::kSmemBytes ? Traits::kSmemBytes
                                                          : DqTraits::kSmemBytes;
      }
    });
  });
  return bytes;
}

// B or Hq is 0: no query head reads k and v, so dk and dv are zeros (heads_q = 0 with
// heads_kv > 0 is a valid GQA shape).
inline bool bwd_launches_nothing(const AttnBwdParams& p) {
  return p.batch == 0 || p.heads_q == 0;
}

struct BwdPlan {
  KernelChoice kernels;  // kernels.arch: kSm90 for the sm_90a backward (plan_bwd_sm90.h)
  Arch device_arch;
  bool empty = false;  // bwd_launches_nothing
  // bwd_dq_accum; the sm_90a backward always sums dQ in fp32 (hopper/bwd_sm90_config.h,
  // DqAccumLayout; deterministic: one slice per key block).
  bool dq_accum = false;
  // fp32 scratch, in floats. sm_80: rows by query_row_index (mask.h): D_i [Hq, total_q], then
  // with dq_accum the dQ accumulator [Hq, total_q, head_dim_tile] from dq_accum_offset on.
  // sm_90a: hopper::bwd_sm90_workspace_floats (row stats, then its dQ accumulator).
  int64_t workspace_floats = 0;
  int smem_bytes = 0;        // bwd_smem_bytes
  int smem_limit_bytes = 0;  // as FwdPlan's
  int arch_smem_bytes = 0;
  BwdSteps steps;
};

// Moves a plan to the sm_90a backward, for a call sm90_bwd_unsupported() accepts: three launches
// (hopper/bwd_sm90_params.h, bwd_sm90_grids): its rows kernel (LSE * log2 e, D_i, the zeroed
// accumulator: not sm_80's row kernels, whose D_i rows and accumulator have the sm_80 layouts),
// the main kernel (dK, dV, dQ by bulk reduce-adds), its dQ convert kernel.
inline void use_sm90_bwd(BwdPlan& plan, const AttnBwdParams& p) {
  plan.kernels.arch = Arch::kSm90;
  plan.kernels.head_dim_tile = p.head_dim;
  plan.kernels.head_dim_v_tile = p.head_dim;
  plan.arch_smem_bytes = max_smem_bytes(Arch::kSm90);
  plan.dq_accum = true;
  const hopper::BwdSm90Params hp = make_bwd_sm90_params(p);
  dispatch_head_dim(Sm90BwdHeadDims{}, p.head_dim, [&](auto tile) {
    constexpr int kHeadDim = decltype(tile)::value;
    using Config = hopper::BwdSm90Config<kHeadDim>;
    plan.workspace_floats = hopper::bwd_sm90_workspace_floats<kHeadDim>(hp);
    plan.smem_bytes = static_cast<int>(Config::kSmemBytes);
    const hopper::BwdSm90Grids g = hopper::bwd_sm90_grids<kHeadDim>(hp);
    const auto grid = [](const hopper::BwdSm90Grid& d) { return dim3(d.x, d.y, d.z); };
    plan.steps = BwdSteps{};
    plan.steps.add({BwdKernel::kDotDoO, KernelFamily::kRows, grid(g.rows),
                    dim3(hopper::kRowThreads), 0});
    plan.steps.add({BwdKernel::kDkdv, KernelFamily::kTensorCore, grid(g.main),
                    dim3(Config::kThreads), plan.smem_bytes});
    plan.steps.add({BwdKernel::kConvertDq, KernelFamily::kRows, grid(g.convert),
                    dim3(hopper::kRowThreads), 0});
  });
}

// Plans the backward of `p` (make_bwd_params) for inputs of `type` on `device`: the sm_80 plan,
// or the sm_90a backward where it is enabled and takes the call.
inline BwdPlan plan_bwd(const AttnBwdParams& p, ElementType type, const DeviceProps& device) {
  BwdPlan plan;
  plan.device_arch = device_arch(device);
  plan.kernels = choose_kernels(type, p.head_dim, p.head_dim_v, kernel_arch(plan.device_arch),
                                /*backward=*/true);
  plan.smem_limit_bytes = device.smem_optin_bytes;
  plan.arch_smem_bytes = max_smem_bytes(plan.kernels.arch);
  plan.empty = bwd_launches_nothing(p);
  if (plan.empty) return plan;
  // The sm_90a backward knows no block offsets (params.h, block_offsets).
  if (sm90_bwd_enabled(device.hopper_fwd, device.cc_major, device.cc_minor) &&
      p.block_offsets == nullptr && sm90_bwd_unsupported(p, type) == nullptr) {
    use_sm90_bwd(plan, p);
    return plan;
  }
  plan.dq_accum = bwd_dq_accum(p, plan.kernels.family);
  const int64_t rows = static_cast<int64_t>(p.heads_q) * p.total_q;
  plan.workspace_floats =
      plan.dq_accum ? dq_accum_offset(p) + rows * plan.kernels.head_dim_tile : rows;
  plan.smem_bytes = bwd_smem_bytes(plan.kernels);
  dispatch_element(type, [&](auto element) {
    using Element = decltype(element);
    dispatch_head_dims(HeadDimTilesFor<Element, true>{}, plan.kernels.head_dim_tile,
                       plan.kernels.head_dim_v_tile, [&](auto tile, auto tile_v) {
      constexpr int kTile = decltype(tile)::value;
      if constexpr (std::is_same_v<Element, float>) {
        plan.steps = bwd_steps_simt<kTile>(p);
      } else {
        plan.steps = bwd_steps_16bit<kTile, decltype(tile_v)::value>(p);
      }
    });
  });
  return plan;
}

}  // namespace flashattn::cuda
