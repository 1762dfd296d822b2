// flash_attn_with_kvcache's in-place append and rotary embedding on the GPU: the per-row code
// of ../kv_append.h, which the CPU runs too, one thread per row. Rows are 1 (decode) to a few
// thousand (prefill) of head_dim elements, next to an attention that reads the whole cache.
// Positions outside the cache or the rotary tables are skipped or clamped there: nothing
// checks cache_seqlens on the host for a device.
#pragma once
#include <cstdint>

#include "../kv_append.h"
#include "element.cuh"
#include "grid.h"

namespace flashattn::cuda {

// Thread i handles row i of kv_append.h's append_or_rotate_row (grid-stride).
template <typename Element>
__global__ void kv_append_kernel(const KvAppendParams p) {
  const int64_t rows = append_rows(p) + query_rows(p);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows;
       i += step)
    append_or_rotate_row<StoredElement<Element>, float>(p, i);
}

// Launches kv_append_kernel for Element (__half, __nv_bfloat16 or float).
template <typename Element>
void run_kv_append(const KvAppendParams& p, cudaStream_t stream, LaunchCheck after_launch) {
  constexpr int kThreads = 128;
  const int64_t rows = append_rows(p) + query_rows(p);
  if (rows == 0) return;
  const int64_t blocks = (rows + kThreads - 1) / kThreads;
  auto* kernel = &kv_append_kernel<Element>;
  FLASHATTN_LAUNCH_KERNEL(kernel, dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535)),
                          dim3(kThreads), 0, stream, p);
  after_launch();
}

}  // namespace flashattn::cuda
