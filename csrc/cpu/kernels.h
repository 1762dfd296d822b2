// Entry points of the CPU kernels. Both are bitwise deterministic for any thread count.
#pragma once
#include <c10/core/ScalarType.h>

#include "../params.h"

namespace flashattn::cpu {

// Writes p.o and p.lse. dtype: float, double, half or bfloat16 (computed in fp32,
// double in fp64).
void run_fwd(const AttnParams& p, c10::ScalarType dtype);

// Writes p.dq, p.dk and p.dv from the saved output and LSE.
void run_bwd(const AttnBwdParams& p, c10::ScalarType dtype);

// flash_attn_with_kvcache's append into the cache and rotary embedding (kv_append.h).
void run_kv_append(const KvAppendParams& p, c10::ScalarType dtype);

#ifdef FLASHATTN_TEST_COUNTERS
// Only in the test build (tests/cpu_test_ext): the shipped library does not pay an atomic store
// per call for them.
// The most kv heads whose packed K and V the last forward that packed any held at once
// (head_operands.h; tests/test_memory.py).
int64_t fwd_packed_heads_peak();
// The most (sequence, kv head)s whose packed operands and partial dQ the last backward held at
// once (head_operands.h; tests/test_memory.py).
int64_t bwd_packed_heads_peak();
#endif

}  // namespace flashattn::cpu
