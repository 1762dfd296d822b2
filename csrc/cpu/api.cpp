// TORCH_LIBRARY_IMPL(flashattn, CPU): validate, allocate, fill AttnParams, run the CPU kernels.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../attn_args.h"
#include "kernels.h"

namespace flashattn {
namespace {

const ExecutorLimits kCpuLimits{"CPU", {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}, -1};

std::tuple<at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double softmax_scale, bool causal,
                                           int64_t window_left, int64_t window_right,
                                           double softcap,
                                           const std::optional<at::Tensor>& alibi_slopes,
                                           bool align_bottom_right, bool /*deterministic*/) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  auto [out, lse] = check_and_alloc_fwd(q, k, v, mask, kCpuLimits);
  cpu::run_fwd(make_fwd_params(q, k, v, out, lse, mask), q.scalar_type());
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, bool align_bottom_right,
    bool deterministic) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  auto [dq, dk, dv] = check_and_alloc_bwd(dout, q, k, v, out, lse, dlse, mask, kCpuLimits);
  cpu::run_bwd(make_bwd_params(dout, q, k, v, out, lse, dlse, dq, dk, dv, mask, deterministic),
               q.scalar_type());
  return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY_IMPL(flashattn, CPU, m) {
  m.impl("fwd", &fwd_cpu);
  m.impl("bwd", &bwd_cpu);
}

}  // namespace flashattn
