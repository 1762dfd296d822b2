// Split-KV's merge on the GPU: each query row's num_splits partial outputs and LSEs (params.h,
// split_out / split_lse, written by the forward kernels) into out and lse, as the CPU merges its
// splits (cpu/fwd.cpp, merge_splits):
//   out = sum_s w_s out_s / sum_s w_s,  w_s = exp(lse_s - max_s lse_s),  lse = max + log sum w_s.
// An empty split (lse -inf) weighs 0; a NaN LSE makes the row NaN; a row that saw no key, or
// that no split wrote (the workspace starts as 0 and -inf), gets 0 and -inf.
#pragma once
#include <cmath>
#include <cstdint>

#include "../mask.h"
#include "../params.h"
#include "element.cuh"
#include "grid.h"

namespace flashattn::cuda {

// Thread i merges (query slot i / heads_q, head i % heads_q); the slots are the rows of o:
// batch x seqlen_q, or total_q for a varlen batch. Grid-stride. The weights are recomputed per
// column rather than kept in a per-split array, which would live in local memory.
template <typename Element>
__global__ void split_merge_kernel(const AttnParams p, const float* split_scratch) {
  using T = StoredElement<Element>;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t slots = output_rows(p);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < slots * p.heads_q; i += step) {
    const int head = static_cast<int>(i % p.heads_q);
    const int64_t slot = i / p.heads_q;
    const int b = varlen ? 0 : static_cast<int>(slot / p.seqlen_q);
    const int64_t row = varlen ? slot : slot % p.seqlen_q;
    const int64_t out_stride = split_out_elements(p), lse_stride = split_lse_elements(p);
    float* scratch = const_cast<float*>(split_scratch);
    const float* lse_s = split_lse_of(p, scratch, 0, b, head, row);  // split s: + s * lse_stride
    const float* out_s = split_out_row(p, scratch, 0, b, head, row);
    float max_lse = -INFINITY;
    bool nan = false;
    for (int s = 0; s < p.num_splits; ++s) {
      const float lse = lse_s[s * lse_stride];
      nan |= lse != lse;
      max_lse = fmaxf(max_lse, lse);
    }
    const bool saw_keys = max_lse != -INFINITY;
    float weight_sum = 0.f;
    if (saw_keys)
      for (int s = 0; s < p.num_splits; ++s)
        weight_sum += expf(lse_s[s * lse_stride] - max_lse);
    const float inv_sum = nan ? NAN : (weight_sum > 0.f ? 1.f / weight_sum : 0.f);
    T* out = p.o.row<T>(b, head, row);
    for (int d = 0; d < p.head_dim; ++d) {
      float merged = 0.f;
      if (saw_keys)
        for (int s = 0; s < p.num_splits; ++s) {
          const float weight = expf(lse_s[s * lse_stride] - max_lse);
          if (weight != 0.f) merged += weight * out_s[s * out_stride + d];
        }
      out[d] = static_cast<T>(merged * inv_sum);
    }
    *p.lse.row<float>(b, head, row) =
        nan ? NAN : (weight_sum > 0.f ? max_lse + logf(weight_sum) : -INFINITY);
  }
}

// Launches split_merge_kernel for Element (__half, __nv_bfloat16 or float); p.num_splits > 1.
template <typename Element>
void run_split_merge(const AttnParams& p, const float* split_scratch, cudaStream_t stream,
                     LaunchCheck after_launch) {
  constexpr int kThreads = 128;
  const int64_t rows = output_rows(p) * p.heads_q;
  if (rows == 0) return;
  const int64_t blocks = (rows + kThreads - 1) / kThreads;
  auto* kernel = &split_merge_kernel<Element>;
  FLASHATTN_LAUNCH_KERNEL(kernel, dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535)),
                          dim3(kThreads), 0, stream, p, split_scratch);
  after_launch();
}

}  // namespace flashattn::cuda
