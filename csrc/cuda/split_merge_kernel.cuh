// Split-KV's merge on the GPU: each query row's num_splits partial outputs and LSEs (params.h,
// split_out / split_lse, written by the forward kernels) into out and lse, as the CPU merges its
// splits (cpu/fwd.cpp, merge_splits):
//   out = sum_s w_s out_s / sum_s w_s,  w_s = exp(lse_s - max_s lse_s),  lse = max + log sum w_s.
// An empty split (lse -inf) weighs 0; a NaN LSE makes the row NaN; a row that saw no key, or
// that no split wrote (the workspace starts as 0 and -inf), gets 0 and -inf.
//
// A warp per output row (query slot x query head). A row's partial outputs are head_dim_v
// (out's head dim) contiguous floats per split, so lanes over the columns read each split's part
// in whole 128-byte lines; lanes over the splits compute each weight once (one expf per split, not
// one per column and split). A thread per row, as before (issue 33), read a row's columns one
// after another, 32 sectors per warp load, and left B = 1's 32 rows on one SM: its time grew
// with head_dim x splits and capped how far a one-sequence decode could split.
#pragma once
#include <cmath>
#include <cstdint>

#include "../mask.h"
#include "../params.h"
#include "element.cuh"
#include "grid.h"
#include "plan_fwd.h"
#include "simt_kernels.cuh"  // warp_max, warp_sum
#include "softmax.cuh"
#include "traits.h"

namespace flashattn::cuda {

// A lane holds the weights of splits lane and lane + 32 (the plan caps splits at kMaxSplits),
// and the sums of columns lane, lane + 32, ... (kColumnsPerLane of them): registers only. The
// two splits are two named registers, not an array, which ptxas put in local memory.
// Two variants: head_dim_v <= 256 (8 columns per lane), and up to kMaxHeadDimV (16, MLA's 512):
// the wide one alone took 119 registers against 63, halving the merge's resident warps.
constexpr int kMergeColumnsPerLane = 256 / kWarpSize;
constexpr int kMergeColumnsPerLaneWide = kMaxHeadDimV / kWarpSize;
constexpr int kMergeWarps = 4;  // warps (rows) per block
static_assert(kMaxSplits == 2 * kWarpSize, "a merge lane holds two splits' weights");
static_assert(kMaxHeadDimV % kWarpSize == 0, "the merge's lanes take whole warps of columns");

// Warp w of block x merges rows x * kMergeWarps + w, grid-stride; row i is (query slot
// i / heads_q, head i % heads_q), the slots being o's rows: batch x seqlen_q, or total_q for a
// varlen batch. Every branch below depends only on the row, so the warp stays converged for
// its shuffles.
template <typename Element, int kColumnsPerLane>
__global__ void split_merge_kernel(const AttnParams p, const float* split_scratch) {
  using T = StoredElement<Element>;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t rows = output_rows(p) * p.heads_q;
  const int64_t warps_per_block = blockDim.x / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps_per_block;
  const int64_t out_stride = split_out_elements(p), lse_stride = split_lse_elements(p);
  float* scratch = const_cast<float*>(split_scratch);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarpSize;
       i < rows; i += step) {
    const int head = static_cast<int>(i % p.heads_q);
    const int64_t slot = i / p.heads_q;
    const int b = varlen ? 0 : static_cast<int>(slot / p.seqlen_q);
    const int64_t row = varlen ? slot : slot % p.seqlen_q;
    const float* lse_s = split_lse_of(p, scratch, 0, b, head, row);  // split s: + s * lse_stride
    const float* out_s = split_out_row(p, scratch, 0, b, head, row);

    // This lane's splits' LSEs (-inf past num_splits: weight 0), the row's max and NaN flag.
    const int high = lane + kWarpSize;
    const float lse_low =
        lane < p.num_splits ? FLASHATTN_GMEM(lse_s)[lane * lse_stride] : -INFINITY;
    const float lse_high =
        high < p.num_splits ? FLASHATTN_GMEM(lse_s)[high * lse_stride] : -INFINITY;
    const bool nan = __any_sync(kFullWarpMask, lse_low != lse_low || lse_high != lse_high);
    const float max_lse = warp_max(fmaxf(lse_low, lse_high));
    const bool saw_keys = max_lse != -INFINITY;
    const float weight_low = saw_keys ? expf(lse_low - max_lse) : 0.f;
    const float weight_high = saw_keys ? expf(lse_high - max_lse) : 0.f;
    const float weight_sum = warp_sum(weight_low + weight_high);
    const float inv_sum = nan ? NAN : (weight_sum > 0.f ? 1.f / weight_sum : 0.f);

    // Split by split, in order: the weight from the lane that holds it, then its part of each
    // of this lane's columns. A split of weight 0 (empty, or far below the max) is not read.
    float merged[kColumnsPerLane] = {};
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = __shfl_sync(kFullWarpMask, s < kWarpSize ? weight_low : weight_high,
                                  s % kWarpSize);
      if (w == 0.f) continue;
      const float* part = out_s + s * out_stride;
#pragma unroll
      for (int c = 0; c < kColumnsPerLane; ++c) {
        const int d = lane + c * kWarpSize;
        if (d < p.head_dim_v) merged[c] += w * FLASHATTN_GMEM(part)[d];
      }
    }
    T* out = p.o.row<T>(b, head, row);
#pragma unroll
    for (int c = 0; c < kColumnsPerLane; ++c) {
      const int d = lane + c * kWarpSize;
      if (d < p.head_dim_v) FLASHATTN_GMEM(out)[d] = static_cast<T>(merged[c] * inv_sum);
    }
    if (lane == 0)
      *FLASHATTN_GMEM(p.lse.row<float>(b, head, row)) =
          nan ? NAN : (weight_sum > 0.f ? max_lse + logf(weight_sum) : -INFINITY);
  }
}

// The merge's grid for p: a warp per row, at most 65535 blocks (grid-stride beyond).
inline dim3 split_merge_grid(const AttnParams& p) {
  const int64_t rows = output_rows(p) * p.heads_q;
  const int64_t blocks = (rows + kMergeWarps - 1) / kMergeWarps;
  return dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
}

// Launches split_merge_kernel for Element (__half, __nv_bfloat16 or float: out's type);
// p.num_splits >= 1 (one: a float32 out of 16-bit inputs, plan_fwd.h merges).
template <typename Element>
void run_split_merge(const AttnParams& p, const float* split_scratch, cudaStream_t stream,
                     LaunchCheck after_launch) {
  if (output_rows(p) * p.heads_q == 0) return;
  auto* kernel = p.head_dim_v <= kMergeColumnsPerLane * kWarpSize
                     ? &split_merge_kernel<Element, kMergeColumnsPerLane>
                     : &split_merge_kernel<Element, kMergeColumnsPerLaneWide>;
  FLASHATTN_LAUNCH_KERNEL(kernel, split_merge_grid(p), dim3(kMergeWarps * kWarpSize), 0, stream,
                          p, split_scratch);
  after_launch();
}

}  // namespace flashattn::cuda
