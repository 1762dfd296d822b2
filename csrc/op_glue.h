// The ops' C++ signatures (schema.h), written once for every executor: the schema's arguments
// become MaskOptions, the shared checks validate the inputs and allocate the outputs
// (attn_args.h), and the executor runs on the filled parameter struct. An executor is a type
// with
//   static const ExecutorLimits& limits();
//   static void run_fwd(const at::Tensor& q, const AttnParams& p);
//   static void run_bwd(const at::Tensor& q, const AttnBwdParams& p, at::Tensor& dk,
//                       at::Tensor& dv);
// and registers fwd_op<Executor> / bwd_op<Executor> for its dispatch key.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "attn_args.h"

namespace flashattn {

template <typename Executor>
std::tuple<at::Tensor, at::Tensor> fwd_op(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, double softmax_scale, bool causal,
                                          int64_t window_left, int64_t window_right,
                                          double softcap,
                                          const std::optional<at::Tensor>& alibi_slopes,
                                          bool align_bottom_right, bool /*deterministic*/) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  auto [out, lse] = check_and_alloc_fwd(q, k, v, mask, Executor::limits());
  Executor::run_fwd(q, make_fwd_params(q, k, v, out, lse, mask));
  return {out, lse};
}

template <typename Executor>
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_op(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    const std::optional<at::Tensor>& alibi_slopes, bool align_bottom_right, bool deterministic) {
  const MaskOptions mask{softmax_scale, causal,       window_left,       window_right,
                         softcap,       alibi_slopes, align_bottom_right};
  auto [dq, dk, dv] =
      check_and_alloc_bwd(dout, q, k, v, out, lse, dlse, mask, Executor::limits());
  Executor::run_bwd(
      q, make_bwd_params(dout, q, k, v, out, lse, dlse, dq, dk, dv, mask, deterministic), dk,
      dv);
  return {dq, dk, dv};
}

}  // namespace flashattn
