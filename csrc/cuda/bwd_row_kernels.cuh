// The backward's two row-wise SIMT kernels, one warp per row of one (batch, head):
//   bwd_dot_do_o_kernel   D_i = rowsum(dO_i * O_i) - dLSE_i (FA2's preprocessing), and zeroes
//                         the fp32 dQ accumulator the dK/dV kernel adds into;
//   bwd_convert_dq_kernel dQ fp32 accumulator -> dQ in the input dtype and strides.
#pragma once
#include <cstdint>
#include <type_traits>

#include "../params.h"
#include "element.cuh"
#include "grid.h"
#include "softmax.cuh"
#include "traits.h"

namespace flashattn::cuda {

// The row of [B, Hq, Sq] this warp handles, or -1 when it is past the end.
__device__ __forceinline__ int64_t row_kernel_row(const AttnParams& p, int& row) {
  const int64_t batch_head = folded_batch_head();
  row = blockIdx.x * kRowKernelWarps + threadIdx.x / kWarpSize;
  if (batch_head >= static_cast<int64_t>(p.batch) * p.heads_q || row >= p.seqlen_q) return -1;
  return batch_head;
}

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
                        float* d_gmem,         // [B, Hq, Sq] D_i
                        float* dq_accum_gmem,  // [B, Hq, Sq, dq_accum_cols], or nullptr
                        int dq_accum_cols) {
  int row;
  const int64_t batch_head = row_kernel_row(p, row);
  if (batch_head < 0) return;
  const int batch = static_cast<int>(batch_head / p.heads_q);
  const int head = static_cast<int>(batch_head % p.heads_q);
  const int lane = threadIdx.x % kWarpSize;
  // [D] rows of O and dO.
  const Storage<Element>* o_row = p.o.row<const Storage<Element>>(batch, head, row);
  const Storage<Element>* do_row = p.dout.row<const Storage<Element>>(batch, head, row);
  float sum = 0.f;
  for (int c = lane; c < p.head_dim; c += kWarpSize)
    sum += load_as_float<Element>(o_row + c) * load_as_float<Element>(do_row + c);
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(kFullWarpMask, sum, offset);
  const int64_t row_index = batch_head * p.seqlen_q + row;  // into the [B, Hq, Sq] workspace
  if (lane == 0) {
    const float dlse = p.dlse.ptr != nullptr ? *p.dlse.row<const float>(batch, head, row) : 0.f;
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
                          const float* dq_accum_gmem,  // [B, Hq, Sq, dq_accum_cols]
                          int dq_accum_cols) {
  int row;
  const int64_t batch_head = row_kernel_row(p, row);
  if (batch_head < 0) return;
  const int batch = static_cast<int>(batch_head / p.heads_q);
  const int head = static_cast<int>(batch_head % p.heads_q);
  const int lane = threadIdx.x % kWarpSize;
  const float* accum_row = dq_accum_gmem + (batch_head * p.seqlen_q + row) * dq_accum_cols;
  uint16_t* dq_row = p.dq.row<uint16_t>(batch, head, row);  // [D]
  for (int c = lane; c < p.head_dim; c += kWarpSize)
    dq_row[c] = static_cast<uint16_t>(pack_rn<Element>(accum_row[c], 0.f));
}

}  // namespace flashattn::cuda
