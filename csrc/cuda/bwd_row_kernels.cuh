// The backward's two row-wise SIMT kernels, one warp per row of one (batch, head):
//   bwd_dot_do_o_kernel   D_i = rowsum(dO_i * O_i) - dLSE_i (FA2's preprocessing), and zeroes
//                         the fp32 dQ accumulator the dK/dV kernel adds into;
//   bwd_convert_dq_kernel dQ fp32 accumulator -> dQ in the input dtype (float32 with
//                         grads_fp32) and strides.
#pragma once
#include <cstdint>
#include <type_traits>

#include "../mask.h"
#include "../params.h"
#include "bwd_epilogue.cuh"
#include "element.cuh"
#include "grid.h"
#include "softmax.cuh"
#include "tile_scheduler.cuh"
#include "traits.h"

namespace flashattn::cuda {

// Element as stored: raw 16-bit bits, or float.
template <typename Element>
using Storage = std::conditional_t<std::is_same_v<Element, float>, float, uint16_t>;

template <typename Element>
__device__ __forceinline__ float load_as_float(const Storage<Element>* ptr) {
  if constexpr (std::is_same_v<Element, float>) {
    return *ptr;
  } else {
    return to_float<Element>(*ptr);
  }
}

// Element: __half, __nv_bfloat16 or float.
template <typename Element>
__global__ void __launch_bounds__(kRowKernelThreads)
    bwd_dot_do_o_kernel(const AttnBwdParams p,
                        float* d_gmem,         // D_i (mask.h, query_row_index)
                        float* dq_accum_gmem,  // rows of dq_accum_cols, or nullptr
                        int dq_accum_cols) {
  if (!in_grid<TileAxis::kQueries>(p)) return;
  const auto at = work_tile<TileAxis::kQueries, kRowKernelWarps>(p, threadIdx.x / kWarpSize);
  if (at.past_end()) return;
  const int row = at.start;  // a row a warp
  const int64_t q_row = at.seq.q_row0 + row;
  const int lane = threadIdx.x % kWarpSize;
  // [Dv] rows of O and dO.
  const Storage<Element>* o_row = p.o.row<const Storage<Element>>(at.batch, at.head, q_row);
  const Storage<Element>* do_row = p.dout.row<const Storage<Element>>(at.batch, at.head, q_row);
  float sum = 0.f;
  for (int c = lane; c < p.head_dim_v; c += kWarpSize)  // O and dO: v's head dim
    sum += load_as_float<Element>(o_row + c) * load_as_float<Element>(do_row + c);
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(kFullWarpMask, sum, offset);
  const int64_t row_index = query_row_index(p, at.seq, at.head, row);
  if (lane == 0) {
    const float dlse =
        p.dlse.ptr != nullptr ? *p.dlse.row<const float>(at.batch, at.head, q_row) : 0.f;
    d_gmem[row_index] = sum - dlse;
  }
  if (dq_accum_gmem != nullptr) {
    float* dq_row = dq_accum_gmem + row_index * dq_accum_cols;
    for (int c = lane; c < dq_accum_cols; c += kWarpSize) dq_row[c] = 0.f;
  }
}

template <typename Element>
__global__ void __launch_bounds__(kRowKernelThreads)
    bwd_convert_dq_kernel(const AttnBwdParams p,
                          const float* dq_accum_gmem,  // rows of dq_accum_cols, same index
                          int dq_accum_cols) {
  if (!in_grid<TileAxis::kQueries>(p)) return;
  const auto at = work_tile<TileAxis::kQueries, kRowKernelWarps>(p, threadIdx.x / kWarpSize);
  if (at.past_end()) return;
  const int row = at.start;  // a row a warp
  const int lane = threadIdx.x % kWarpSize;
  const float* accum_row =
      dq_accum_gmem + query_row_index(p, at.seq, at.head, row) * dq_accum_cols;
  // Where dQ's row goes (bwd_epilogue.cuh).
  const GradRows dq = GradRows::dq(p, at.seq, at.batch, at.head);
  if (p.grads_fp32) {  // float32 dq of 16-bit inputs (params.h): the sum unrounded
    float* dq_row = dq.row<float>(row);  // [D]
    for (int c = lane; c < p.head_dim; c += kWarpSize) dq_row[c] = accum_row[c];
    return;
  }
  uint16_t* dq_row = dq.row<uint16_t>(row);  // [D]
  for (int c = lane; c < p.head_dim; c += kWarpSize)
    dq_row[c] = static_cast<uint16_t>(pack_rn<Element>(accum_row[c], 0.f));
}

}  // namespace flashattn::cuda
