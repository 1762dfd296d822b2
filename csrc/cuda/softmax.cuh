// Online softmax over the registers of an mma accumulator (FlashAttention-2, Algorithm 1).
//
// Accumulator layout (mma.m16n8k16 C fragment): a warp owns 16 rows; lane L holds rows
// L/4 and L/4 + 8. For each 8-column n-tile j, acc[j][0..1] are row L/4, columns 2(L%4)+{0,1},
// and acc[j][2..3] are row L/4 + 8. So a row is spread over the 4 lanes of a quad, and row
// reductions are two xor-shuffles.
#pragma once
#include <cmath>

#include "ptx.cuh"
#include "traits.h"

namespace flashattn::cuda {

constexpr int kRowsPerThread = 2;  // rows L/4 and L/4 + 8 of the warp's 16
constexpr int kRowOffsetHi = kMmaM / 2;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFullWarpMask = 0xffffffffu;

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullWarpMask, x, 1);
  return x + __shfl_xor_sync(kFullWarpMask, x, 2);
}

// A forward row's end, in every forward layout: from its max m (log2 units) and its sum l of
// exp2 terms, 1 / l and the natural-log LSE. l is 0 only for a row that saw no key: its output is
// 0 and its LSE -inf. A NaN l (NaN inputs) goes on into out and the LSE, as softmax would.
__device__ __forceinline__ void finish_row(float m_log2, float l, float& inv_l, float& lse) {
  const bool saw_keys = l != 0.f;
  inv_l = saw_keys ? 1.f / l : 0.f;
  lse = saw_keys ? (m_log2 + log2f(l)) * kLn2 : -INFINITY;
}

// Running row statistics m_i (max, accumulator units) and l_i (this lane's partial sum of
// exp2 terms; the quad's partial sums are added once, in finalize()).
struct RowStats {
  float m[kRowsPerThread];
  float l[kRowsPerThread];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) m[r] = -INFINITY, l[r] = 0.f;
  }

  // Turns the scores S_ij of one key tile into P_ij = exp2(S_ij * to_log2 - m_i) in place,
  // rescales O_i by exp2(m_i_old - m_i_new) and updates l_i.
  template <int kNTilesN, int kNTilesD>
  __device__ __forceinline__ void update(float (&s_rmem)[kNTilesN][4],
                                         float (&o_rmem)[kNTilesD][4], float to_log2) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kNTilesN; ++j)
        tile_max = fmaxf(tile_max, fmaxf(s_rmem[j][2 * r], s_rmem[j][2 * r + 1]));
      const float m_new = fmaxf(m[r], quad_max(tile_max));
      // A row that has seen only masked keys keeps m = -inf: subtract 0 instead, so that
      // -inf - -inf never makes a NaN (its P_ij are exp2(-inf) = 0).
      const float m_new_log2 = m_new == -INFINITY ? 0.f : m_new * to_log2;
      const float correction = ptx::exp2_approx(m[r] * to_log2 - m_new_log2);
      m[r] = m_new;
      float row_sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNTilesN; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float p = ptx::exp2_approx(fmaf(s_rmem[j][2 * r + c], to_log2, -m_new_log2));
          s_rmem[j][2 * r + c] = p;
          row_sum += p;
        }
      }
      l[r] = l[r] * correction + row_sum;
#pragma unroll
      for (int d = 0; d < kNTilesD; ++d) {
        o_rmem[d][2 * r] *= correction;
        o_rmem[d][2 * r + 1] *= correction;
      }
    }
  }

  // Reduces l_i over the quad and returns 1 / l_i and the natural-log LSE (finish_row).
  __device__ __forceinline__ void finalize(float to_log2, float (&inv_l)[kRowsPerThread],
                                           float (&lse)[kRowsPerThread]) const {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
      finish_row(m[r] * to_log2, quad_sum(l[r]), inv_l[r], lse[r]);
  }
};

}  // namespace flashattn::cuda
