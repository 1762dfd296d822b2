// The scalar pieces of the logit that every CUDA kernel shares, the sm_90a ones included: log2(e),
// the backward's LSE shift and an accurate tanh for the softcap. The score pipeline that uses
// them is score_rules.cuh.
#pragma once
#include <cmath>

namespace flashattn::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// The backward's shift that recomputes P_ij = exp2(logit_ij * log2e - shift) from the forward's
// LSE. A row that saw no key has LSE -inf; its shift is +inf, so its P is 0 even where a logit
// is -inf itself (an attn_mask entry), instead of exp2(-inf + inf) = NaN.
__device__ __forceinline__ float lse_shift_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

// tanh(x) to a few ulp. The build's --use_fast_math (setup.py) turns tanhf into the hardware's
// tanh.approx.f32, ~2^-11 relative error: on an H200 that made softcapped fp32 results 30x less
// accurate than PyTorch's (the shim, with the host's tanhf, cannot see it). expm1f keeps its
// accuracy under fast math; only the division becomes approximate (2 ulp). tanh(9) rounds to 1
// in fp32, and the comparison lets a NaN through.
__device__ __forceinline__ float tanh_accurate(float x) {
  const float a = fabsf(x);
  const float e = expm1f(2.f * (a > 9.f ? 9.f : a));
  return copysignf(e / (e + 2.f), x);
}

}  // namespace flashattn::cuda
