// Input validation and parameter-struct construction, written once for every executor.
//
// Every error names the argument and shows what was expected and what was given; messages
// speak of dimensions by meaning (batch, heads, head dim) so they read right from both the
// FA2-style (B, S, H, D) and the SDPA-style (B, H, S, D) front ends.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <vector>

#include "params.h"

namespace flashattn {

// Mask and score options exactly as they arrive through the op schema.
struct MaskOptions {
  double softmax_scale;
  bool causal;
  int64_t window_left;
  int64_t window_right;
  double softcap;
  const std::optional<at::Tensor>& alibi_slopes;
  bool align_bottom_right;
};

// What one executor accepts; checked up front so an unsupported input is an error, never a
// silent slow path or a wrong answer.
struct ExecutorLimits {
  const char* name;                         // "CPU", "CUDA", ...
  std::vector<at::ScalarType> dtypes;       // accepted input dtypes
  int64_t max_head_dim;                     // inclusive; -1 = any
};

// Validates q/k/v (and the mask options) and returns freshly allocated (out, lse):
// out [B, Sq, Hq, D] contiguous in q's dtype, lse [B, Hq, Sq] fp32.
std::tuple<at::Tensor, at::Tensor> check_and_alloc_fwd(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v,
                                                       const MaskOptions& mask,
                                                       const ExecutorLimits& limits);

AttnParams make_fwd_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& out, const at::Tensor& lse,
                           const MaskOptions& mask);

// Validates the backward inputs against the forward ones and returns freshly allocated
// (dq, dk, dv), each contiguous with the shape of its input.
std::tuple<at::Tensor, at::Tensor, at::Tensor> check_and_alloc_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    const MaskOptions& mask, const ExecutorLimits& limits);

AttnBwdParams make_bwd_params(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                              const std::optional<at::Tensor>& dlse, const at::Tensor& dq,
                              const at::Tensor& dk, const at::Tensor& dv,
                              const MaskOptions& mask, bool deterministic);

// With FLASHATTN_POISON_OUTPUTS=1 in the environment (read once), freshly allocated outputs are
// filled with NaN before a kernel writes them, so tests see any element a kernel forgot.
void poison_if_debugging(at::Tensor& t);

}  // namespace flashattn
