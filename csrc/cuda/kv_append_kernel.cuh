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

// Thread i handles row i of [new keys and values: B x S_new x Hkv] then, with rotary
// embeddings, of [queries: B x Sq x Hq] (grid-stride).
template <typename Element>
__global__ void kv_append_kernel(const KvAppendParams p) {
  using T = StoredElement<Element>;
  const int64_t append_rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.heads_kv;
  const int64_t query_rows =
      p.rotary_dim > 0 ? static_cast<int64_t>(p.batch) * p.seqlen_q * p.heads_q : 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < append_rows + query_rows; i += step) {
    if (i < append_rows) {
      const int h = static_cast<int>(i % p.heads_kv);
      const int t = static_cast<int>(i / p.heads_kv % p.seqlen_new);
      const int b = static_cast<int>(i / p.heads_kv / p.seqlen_new);
      T* key = append_row<T>(p.k_cache, p, b, h, t);
      T* value = append_row<T>(p.v_cache, p, b, h, t);
      if (key == nullptr) continue;
      const T* new_key = p.k_new.row<const T>(b, h, t);
      const T* new_value = p.v_new.row<const T>(b, h, t);
      if (p.rotary_dim > 0) {
        rotate_row<T, float>(new_key, key, p, p.cache_seqlens[b] + t);
      } else {
        for (int d = 0; d < p.head_dim; ++d) key[d] = new_key[d];
      }
      for (int d = 0; d < p.head_dim; ++d) value[d] = new_value[d];
    } else {
      const int64_t j = i - append_rows;
      const int h = static_cast<int>(j % p.heads_q);
      const int row = static_cast<int>(j / p.heads_q % p.seqlen_q);
      const int b = static_cast<int>(j / p.heads_q / p.seqlen_q);
      rotate_row<T, float>(p.q.row<const T>(b, h, row), p.q_rotated.row<T>(b, h, row), p,
                           query_position(p, b, row));
    }
  }
}

// Launches kv_append_kernel for Element (__half, __nv_bfloat16 or float).
template <typename Element>
void run_kv_append(const KvAppendParams& p, cudaStream_t stream, LaunchCheck after_launch) {
  constexpr int kThreads = 128;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.seqlen_new * p.heads_kv +
                       (p.rotary_dim > 0 ? static_cast<int64_t>(p.batch) * p.seqlen_q * p.heads_q
                                         : 0);
  if (rows == 0) return;
  const int64_t blocks = (rows + kThreads - 1) / kThreads;
  auto* kernel = &kv_append_kernel<Element>;
  FLASHATTN_LAUNCH_KERNEL(kernel, dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535)),
                          dim3(kThreads), 0, stream, p);
  after_launch();
}

}  // namespace flashattn::cuda
