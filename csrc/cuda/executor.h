// The CUDA executor of op_glue.h, written once for the GPU (api.cu) and for the CPU shim
// (tests/sim_ext/sim_ops.cpp): kernel choice, the shapes with nothing to launch, shared memory,
// the backward's workspace and the launch. What differs between the two is the Device policy:
//   Device::kExecutorName                       how errors name the executor
//   typename Device::Guard(at::Device)          makes q's device current during the launch
//   Device::stream(q)                           the stream to launch on
//   Device::check_smem_fits(bytes, q)           refuses what the device cannot hold
//   Device::check_launch()                      called after every launch
// Host code only: nvcc's device passes never see it (api.cu).
#pragma once
#include <ATen/ATen.h>

#include <limits>

#include "../attn_args.h"
#include "../mask.h"
#include "entry.h"
#include "gqa_decode.h"
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

template <typename Device>
struct CudaExecutor {
  static const ExecutorLimits& limits() {
    static const ExecutorLimits cuda_limits{
        Device::kExecutorName, {at::kHalf, at::kBFloat16, at::kFloat}, kMaxHeadDim,
        /*reads_lengths_on_host=*/false};
    return cuda_limits;
  }

  static void run_fwd(const at::Tensor& q, const AttnParams& params) {
    const KernelChoice choice = choose_kernels(element_type(q.scalar_type()), params.head_dim);
    if (params.batch == 0 || params.heads_q == 0 || params.seqlen_q == 0) return;
    const typename Device::Guard guard(q.device());
    // A decoding step with GQA reads each kv head's cache once for its whole group.
    AttnParams p = pack_gqa_decode(params);
    const FwdLaunchShape shape = fwd_launch_shape(choice, p);
    Device::check_smem_fits(shape.smem_bytes, q);
    p.num_splits = choose_num_splits(p, shape, Device::sm_count(q));
    at::Tensor split_scratch;
    if (p.num_splits > 1) {
      const int64_t outs = p.num_splits * split_out_elements(p);
      split_scratch = at::empty({outs + p.num_splits * split_lse_elements(p)},
                                q.options().dtype(at::kFloat));
      if (p.cu_seqlens_q != nullptr || p.seqused_q != nullptr) {
        // The parts of out (0) and of lse (-inf): rows outside every sequence, which no split
        // writes, merge to 0 and -inf.
        split_scratch.narrow(0, 0, outs).zero_();
        split_scratch.narrow(0, outs, split_scratch.numel() - outs)
            .fill_(-std::numeric_limits<float>::infinity());
      } else {
        // Every split writes its part of every query row (0 and -inf where it sees no key:
        // fwd_kernel.cuh, simt_kernels.cuh), so the merge reads nothing unwritten and the
        // scratch needs no fill, which on a GPU would be two more launches per call. The
        // tests poison it (FLASHATTN_POISON_OUTPUTS) to keep that true.
        poison_if_debugging(split_scratch);
      }
    }
    float* scratch = p.num_splits > 1 ? split_scratch.data_ptr<float>() : nullptr;
    launch_fwd(p, choice, scratch, Device::stream(q), &Device::check_launch);
    if (p.num_splits > 1) {
      // The merge walks out's rows as they are: unpacked (gqa_decode.h).
      AttnParams merge = params;
      merge.num_splits = p.num_splits;
      launch_split_merge(merge, scratch, choice.type, Device::stream(q), &Device::check_launch);
    }
  }

  // flash_attn_with_kvcache's append and rotary embedding, before run_fwd on the same stream.
  static void run_kv_append(const at::Tensor& q, const KvAppendParams& p) {
    const typename Device::Guard guard(q.device());
    launch_kv_append(p, element_type(q.scalar_type()), Device::stream(q), &Device::check_launch);
  }

  static void run_bwd(const at::Tensor& q, const AttnBwdParams& p, at::Tensor& dk,
                      at::Tensor& dv) {
    const KernelChoice choice = choose_kernels(element_type(q.scalar_type()), p.head_dim);
    if (p.batch == 0 || p.heads_q == 0) {
      // No query head reads k and v (heads_q = 0 with heads_kv > 0 is a valid GQA shape).
      dk.zero_();
      dv.zero_();
      return;
    }
    const typename Device::Guard guard(q.device());
    Device::check_smem_fits(bwd_smem_bytes(choice), q);
    at::Tensor workspace =
        at::empty({bwd_workspace_floats(p, choice)}, q.options().dtype(at::kFloat));
    // The kernels must not depend on the scratch's initial contents: tests poison it too.
    poison_if_debugging(workspace);
    launch_bwd(p, choice, workspace.data_ptr<float>(), Device::stream(q), &Device::check_launch);
  }
};

}  // namespace flashattn::cuda
