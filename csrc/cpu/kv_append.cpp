// flash_attn_with_kvcache's in-place append and rotary embedding on CPU (../kv_append.h).
#include <ATen/Parallel.h>

#include "../kv_append.h"
#include "dtype_dispatch.h"
#include "kernels.h"

namespace flashattn::cpu {

void run_kv_append(const KvAppendParams& p, c10::ScalarType dtype) {
  dispatch_input_dtype(dtype, [&](auto tag) {
    using In = typename decltype(tag)::type;
    using T = compute_t<In>;
    if (p.seqlen_new > 0) {
      const int64_t rows = int64_t(p.batch) * p.seqlen_new * p.heads_kv;
      at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int h = static_cast<int>(i % p.heads_kv);
          const int t = static_cast<int>(i / p.heads_kv % p.seqlen_new);
          const int b = static_cast<int>(i / p.heads_kv / p.seqlen_new);
          In* key = append_row<In>(p.k_cache, p, b, h, t);
          In* value = append_row<In>(p.v_cache, p, b, h, t);
          if (key == nullptr) continue;
          const In* new_key = p.k_new.row<const In>(b, h, t);
          const In* new_value = p.v_new.row<const In>(b, h, t);
          if (p.rotary_dim > 0)
            rotate_row<In, T>(new_key, key, p, p.cache_seqlens[b] + t);
          else
            std::copy_n(new_key, p.head_dim, key);
          std::copy_n(new_value, p.head_dim, value);
        }
      });
    }
    if (p.rotary_dim > 0) {
      const int64_t rows = int64_t(p.batch) * p.seqlen_q * p.heads_q;
      at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int h = static_cast<int>(i % p.heads_q);
          const int row = static_cast<int>(i / p.heads_q % p.seqlen_q);
          const int b = static_cast<int>(i / p.heads_q / p.seqlen_q);
          rotate_row<In, T>(p.q.row<const In>(b, h, row), p.q_rotated.row<In>(b, h, row), p,
                            query_position(p, b, row));
        }
      });
    }
  });
}

}  // namespace flashattn::cpu
