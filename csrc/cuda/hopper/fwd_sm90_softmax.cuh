// Online softmax on wgmma accumulators (FlashAttention-2's algorithm, FA3's placement).
//
// The m64nN f32 accumulator (ptx_sm90_mma.cuh): thread (warp w, lane l) holds rows
// 16w + l/4 (r = 0) and 16w + l/4 + 8 (r = 1) of its warpgroup's 64; element i of its
// float[N/2] is row r = (i % 4) / 2, column 8 (i / 4) + 2 (l % 4) + i % 2. So a row is spread
// over the 4 lanes of a quad and its reductions are two xor-shuffles, as on sm_80
// (softmax.cuh, whose quad_max / quad_sum this reuses).
//
// Scores stay in accumulator units; m is their running row max in those units and exp2 takes
// s * scale_log2 - m * scale_log2 (one FFMA). The step is split in two so that the
// overlapped main loop can compute the new P while the previous P * V is still in flight and
// rescale O only once that MMA has retired:
//   max_and_exp(s)   -> s := P (unrounded), updates m and l, returns nothing to O yet;
//   rescale_o(o)     -> O *= exp2(m_old - m_new) of the last max_and_exp.
#pragma once
#include <cmath>

#include "cuda/ptx.cuh"
#include "cuda/softmax.cuh"

namespace flashattn::hopper {

struct OnlineSoftmax {
  float m[2];           // running max, accumulator units; -inf until a row sees a key
  float l[2];           // this lane's partial sum of P; the quad's are added by finalize()
  float correction[2];  // exp2((m_old - m_new) * scale_log2) of the last max_and_exp

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < 2; ++r) m[r] = -INFINITY, l[r] = 0.f, correction[r] = 1.f;
  }

  // s (the scores of one key tile, masked keys -inf) becomes P = exp2(s * scale_log2 - m_new),
  // unrounded; l is rescaled and accumulates the new P.
  template <int kN>
  __device__ __forceinline__ void max_and_exp(float (&s)[kN], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kN / 4; ++j)
        tile_max = fmaxf(tile_max, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      const float m_new = fmaxf(m[r], cuda::quad_max(tile_max));
      // A row that has seen only masked keys keeps m = -inf: subtract 0 instead, so that
      // -inf - -inf never makes a NaN (its P are exp2(-inf) = 0).
      const float m_scaled = m_new == -INFINITY ? 0.f : m_new * scale_log2;
      correction[r] = ptx::exp2_approx(m[r] * scale_log2 - m_scaled);
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kN / 4; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& x = s[4 * j + 2 * r + c];
          x = ptx::exp2_approx(x * scale_log2 - m_scaled);
          sum += x;
        }
      }
      l[r] = l[r] * correction[r] + sum;
    }
  }

  // O *= the correction of the last max_and_exp, row by row.
  template <int kD>
  __device__ __forceinline__ void rescale_o(float (&o)[kD]) const {
#pragma unroll
    for (int i = 0; i < kD; ++i) o[i] *= correction[(i % 4) / 2];
  }

  // 1 / l and the natural-log LSE, by the rule every forward ends with (softmax.cuh,
  // finish_row: 0 and -inf for a row that saw no key).
  __device__ __forceinline__ void finalize(float scale_log2, float (&inv_l)[2], float (&lse)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      cuda::finish_row(m[r] * scale_log2, cuda::quad_sum(l[r]), inv_l[r], lse[r]);
  }
};

}  // namespace flashattn::hopper
