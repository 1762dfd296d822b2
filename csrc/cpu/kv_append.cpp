// flash_attn_with_kvcache's in-place append and rotary embedding on CPU (../kv_append.h).
#include <ATen/Parallel.h>

#include "../kv_append.h"
#include "dtype_dispatch.h"
#include "kernels.h"

namespace flashattn::cpu {

void run_kv_append(const KvAppendParams& p, c10::ScalarType dtype) {
  dispatch_input_dtype(dtype, [&](auto tag) {
    using In = typename decltype(tag)::type;
    at::parallel_for(0, append_rows(p) + query_rows(p), 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) append_or_rotate_row<In, compute_t<In>>(p, i);
    });
  });
}

}  // namespace flashattn::cpu
