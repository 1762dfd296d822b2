// How a raw score q_i . k_j becomes a logit (softmax scale, softcap, ALiBi), for the forward
// and the backward kernels alike.
#pragma once
#include <cmath>

#include "../mask.h"
#include "../params.h"

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

// How a raw score q_i . k_j becomes a logit, and the factor from the accumulator's units to
// log2 units. Plain attention keeps raw scores in the accumulator and folds log2(e) * scale
// into the exp2 FMA (FA2's trick); softcap, ALiBi, attn_mask or a non-positive scale first turn
// the accumulator into natural-log logits, since max() does not commute with those.
struct LogitRules {
  bool keep_raw;      // no per-element transform
  float scale;        // softmax scale
  float softcap;      // > 0: logit = softcap * tanh(scale * s / softcap)
  float scale_over_cap;
  float alibi_slope;  // 0 without ALiBi
  int diag_offset;
  float to_log2;      // accumulator units -> log2 units

  __device__ __forceinline__ static LogitRules make(const AttnParams& p, const Sequence& seq,
                                                    int batch, int head) {
    LogitRules r;
    r.alibi_slope = ::flashattn::alibi_slope(p, batch, head);
    r.keep_raw =
        p.softcap <= 0.f && p.alibi.ptr == nullptr && p.mask.ptr == nullptr && p.scale > 0.f;
    r.scale = p.scale;
    r.softcap = p.softcap;
    r.scale_over_cap = p.softcap > 0.f ? p.scale / p.softcap : 0.f;
    r.diag_offset = seq.diag_offset;
    r.to_log2 = r.keep_raw ? p.scale * kLog2e : kLog2e;
    return r;
  }

  // Raw score -> natural-log logit (only called when !keep_raw).
  __device__ __forceinline__ float logit(float s, int row, int key) const {
    const float x = softcap > 0.f ? softcap * tanh_accurate(s * scale_over_cap) : s * scale;
    return x + alibi_bias(alibi_slope, diag_offset, row, key);
  }

  // The logit in log2 units.
  __device__ __forceinline__ float log2_logit(float s, int row, int key) const {
    return keep_raw ? s * to_log2 : logit(s, row, key) * kLog2e;
  }

  // The logit in log2 units, and d logit / d s (natural units): scale, times 1 - tanh^2 under
  // a softcap; the chain rule the backward applies to dS.
  __device__ __forceinline__ float log2_logit(float s, int row, int key, float& dlogit_ds) const {
    if (keep_raw) {
      dlogit_ds = scale;
      return s * to_log2;
    }
    return logit(s, row, key, dlogit_ds) * kLog2e;
  }

  // Like logit(), and also d logit / d s.
  __device__ __forceinline__ float logit(float s, int row, int key, float& dlogit_ds) const {
    if (softcap > 0.f) {
      const float t = tanh_accurate(s * scale_over_cap);
      dlogit_ds = scale * (1.f - t * t);
      return softcap * t + alibi_bias(alibi_slope, diag_offset, row, key);
    }
    dlogit_ds = scale;
    return s * scale + alibi_bias(alibi_slope, diag_offset, row, key);
  }
};

}  // namespace flashattn::cuda
