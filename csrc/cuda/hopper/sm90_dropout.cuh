// Dropout's keep decisions on the sm_90a kernels' wgmma accumulators: dropout.h's Philox bits
// of (batch, query head, query row, key), the bits of the sm_80 kernels (dropout_bits.cuh) and
// of the CPU for the same seed and offset, whatever the tile shape.
//
// The m64nN f32 accumulator (ptx_sm90_mma.cuh): thread (warp w, lane l) holds element i of its
// float[N / 2] at row 16w + l / 4 + 8 ((i % 4) / 2) of its warpgroup's 64, column
// 8 (i / 4) + 2 (l % 4) + i % 2. A tile's decisions are drawn into one bit per element (bit i),
// by a loop that is not unrolled: unrolled, the Philox temporaries of every element would crowd
// the accumulators out of registers (as on sm_80).
#pragma once
#include <cstdint>

#include "dropout.h"
#include "params.h"

namespace flashattn::hopper {

// Rows are queries (the forward: S = Q K^T): row0 is the thread's first query row (its second
// row0 + 8), n0 the tile's first key, tq = lane % 4, all local to the sequence. n0 is even, so a
// pair's two keys 2k, 2k + 1 are words (0, 1) or (2, 3) of one Philox block.
template <int kN>
__device__ __forceinline__ uint64_t keep_bits_query_rows(const Dropout& d, int batch, int head, int row0,
                                                         int n0, int tq) {
  static_assert(kN <= 64, "one bit per accumulator element");
  const DropoutSeed seed = dropout_seed(d);
  uint64_t bits = 0;
#pragma unroll 1
  for (int pair = 0; pair < kN / 2; ++pair) {  // elements 2 pair and 2 pair + 1
    const int key = n0 + 8 * (pair / 2) + 2 * tq;
    const PhiloxBlock draws = dropout_draws(seed, batch, head, row0 + 8 * (pair % 2), key / 4);
    const uint32_t two = uint32_t(dropout_keeps(d, philox_word(draws, key % 4))) |
                         uint32_t(dropout_keeps(d, philox_word(draws, key % 4 + 1))) << 1;
    bits |= uint64_t(two) << (2 * pair);
  }
  return bits;
}

// The seed and offset, read where they are used: on the GPU two volatile loads (rng_state is
// 8-byte aligned only), which the compiler does not hoist out of the main loop (held across it,
// their registers spilled the d = 64 backward). Called only where dropout is on.
__device__ __forceinline__ DropoutSeed dropout_seed_here(const Dropout& d) {
#if defined(__CUDA_ARCH__)
  DropoutSeed s;
  asm volatile("ld.volatile.global.u64 %0, [%1];\n" : "=l"(s.seed) : "l"(d.rng_state));
  asm volatile("ld.volatile.global.u64 %0, [%1 + 8];\n" : "=l"(s.offset) : "l"(d.rng_state));
  return s;
#else
  return dropout_seed(d);
#endif
}

// Rows are keys (the backward: S^T = K Q^T): key_row is the thread's first key (its second
// key_row + 8), m0 the tile's first query, tq = lane % 4, local to the sequence. Every element
// has its own Philox block (its own query row).
template <int kN, bool kSeedHere = false>
__device__ __forceinline__ uint64_t keep_bits_key_rows(const Dropout& d, int batch, int head, int key_row,
                                                       int m0, int tq) {
  static_assert(kN <= 64, "one bit per accumulator element");
  const DropoutSeed seed = kSeedHere ? dropout_seed_here(d) : dropout_seed(d);
  uint64_t bits = 0;
#pragma unroll 1
  for (int i = 0; i < kN; ++i) {
    const int key = key_row + 8 * ((i % 4) / 2), query = m0 + 8 * (i / 4) + 2 * tq + i % 2;
    const PhiloxBlock draws = dropout_draws(seed, batch, head, query, key / 4);
    bits |= uint64_t(dropout_keeps(d, philox_word(draws, key % 4))) << i;
  }
  return bits;
}

// What element i is multiplied by: 1 / (1 - p) if kept, else 0.
__device__ __forceinline__ float keep_factor(uint64_t bits, int i, float keep_scale) {
  return (bits >> i) & 1u ? keep_scale : 0.f;
}

// P := P * Z / (1 - p), element by element (the product with V only: the row sums took all of P).
template <int kN>
__device__ __forceinline__ void apply_dropout(float (&p)[kN], uint64_t bits, float keep_scale) {
#pragma unroll
  for (int i = 0; i < kN; ++i) p[i] *= keep_factor(bits, i, keep_scale);
}

}  // namespace flashattn::hopper
