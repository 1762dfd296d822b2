// flash_attn_with_kvcache's in-place append and rotary embedding on the GPU: the per-row code
// of ../kv_append.h, which the CPU runs too, a warp per row. Rows are 1 (decode) to a few
// thousand (prefill) of head_dim elements, next to an attention that reads the whole cache.
// A thread per row (before issue 33) read and wrote its row's elements one after another,
// each warp access touching 32 rows head_dim x 2 bytes apart; lanes over a row's elements
// touch neighbouring ones (a rotary pair: GPT-J's two neighbours, or one element of each
// GPT-NeoX half), so a warp access is a few whole sectors, and a prefill's rows spread over
// many warps and SMs. Positions outside the cache or the rotary tables are skipped or clamped
// there: nothing checks cache_seqlens on the host for a device.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "../kv_append.h"
#include "element.cuh"
#include "grid.h"
#include "traits.h"

namespace flashattn::cuda {

constexpr int kAppendWarps = 4;  // warps (rows) per block

// Warp w of block x handles rows x * kAppendWarps + w, grid-stride, of kv_append.h's
// append_or_rotate_row; its lanes share the row.
template <typename Element>
__global__ void kv_append_kernel(const KvAppendParams p) {
  const int64_t rows = append_rows(p) + query_rows(p);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warps_per_block = blockDim.x / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarpSize;
       i < rows; i += step)
    append_or_rotate_row<StoredElement<Element>, float>(p, i, lane, kWarpSize);
}

// The append's grid for p: a warp per row, at most 65535 blocks (grid-stride beyond).
inline dim3 kv_append_grid(const KvAppendParams& p) {
  const int64_t rows = append_rows(p) + query_rows(p);
  const int64_t blocks = (rows + kAppendWarps - 1) / kAppendWarps;
  return dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
}

// Launches kv_append_kernel for Element (__half, __nv_bfloat16 or float; __nv_fp8_e4m3 for an
// FP8 cache, whose rows are only copied: kvcache_args.cpp refuses rotary there).
template <typename Element>
void run_kv_append(const KvAppendParams& p, cudaStream_t stream, LaunchCheck after_launch) {
  if (append_rows(p) + query_rows(p) == 0) return;
  auto* kernel = &kv_append_kernel<Element>;
  FLASHATTN_LAUNCH_KERNEL(kernel, kv_append_grid(p), dim3(kAppendWarps * kWarpSize), 0, stream,
                          p);
  after_launch();
}

}  // namespace flashattn::cuda
