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

// The forward's arguments (schema.h's kAttnArguments), which the backward repeats by name.
struct AttnInputs {
  at::Tensor q, k, v;
  std::optional<double> softmax_scale;  // none: 1 / sqrt(head_dim)
  bool causal = false;
  int64_t window_left = -1;
  int64_t window_right = -1;
  double softcap = 0.0;
  std::optional<at::Tensor> alibi_slopes;
  bool align_bottom_right = true;
  bool deterministic = false;
};

// What the backward takes besides the forward's arguments.
struct BwdInputs {
  at::Tensor dout, out, lse;
  std::optional<at::Tensor> dlse;
};

// What one executor accepts; checked up front so an unsupported input is an error, never a
// silent slow path or a wrong answer.
struct ExecutorLimits {
  const char* name;                         // "CPU", "CUDA", ...
  std::vector<at::ScalarType> dtypes;       // accepted input dtypes
  int64_t max_head_dim;                     // inclusive; -1 = any
};

// Validates the inputs and returns freshly allocated (out, lse): out [B, Sq, Hq, D]
// contiguous in q's dtype, lse [B, Hq, Sq] fp32.
std::tuple<at::Tensor, at::Tensor> check_and_alloc_fwd(const AttnInputs& in,
                                                       const ExecutorLimits& limits);

AttnParams make_fwd_params(const AttnInputs& in, const at::Tensor& out, const at::Tensor& lse);

// Validates the backward inputs against the forward ones and returns freshly allocated
// (dq, dk, dv), each contiguous with the shape of its input.
std::tuple<at::Tensor, at::Tensor, at::Tensor> check_and_alloc_bwd(const AttnInputs& in,
                                                                   const BwdInputs& grads,
                                                                   const ExecutorLimits& limits);

AttnBwdParams make_bwd_params(const AttnInputs& in, const BwdInputs& grads, const at::Tensor& dq,
                              const at::Tensor& dk, const at::Tensor& dv);

// With FLASHATTN_POISON_OUTPUTS=1 in the environment (read once), freshly allocated outputs are
// filled with NaN before a kernel writes them, so tests see any element a kernel forgot.
void poison_if_debugging(at::Tensor& t);

}  // namespace flashattn
