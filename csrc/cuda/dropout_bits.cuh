// A lane's dropout decisions for one accumulator tile (dropout.h), drawn before the tile's
// element loop and kept as one bit per entry: bit 4j + c for entry c of n-tile j (the mma
// accumulator layout: entries 0, 1 in the lane's first row, 2, 3 in its second, at two adjacent
// columns). The Philox calls run in a loop that is not unrolled: unrolled into the element loop,
// their temporaries crowd the S, dP and O accumulators out of registers (and four times as
// many calls would run). The seed is read from global memory per tile (cached), not kept in
// four registers for the whole kernel.
#pragma once
#include <cstdint>

#include "../dropout.h"
#include "../sequence.h"
#include "traits.h"

namespace flashattn::cuda {

// Rows are queries (forward, dQ): entry (j, c) is query rows[c / 2], key
// n_start + 8j + lane_col + c % 2 (local; seq's offsets place them in the whole attention,
// mask.h). The lane's two keys of a row share one Philox block unless the block's key offset
// is odd and the first of them ends a group of four.
template <int kTiles>
__device__ __forceinline__ uint32_t keep_bits_by_query_rows(const Dropout& d, const Sequence& seq,
                                                            int head, const int (&rows)[2],
                                                            int n_start, int lane_col) {
  static_assert(kTiles * 4 <= 32, "one bit per entry");
  const DropoutSeed seed = dropout_seed(d);
  uint32_t bits = 0;
#pragma unroll 1
  for (int i = 0; i < 2 * kTiles; ++i) {
    const int j = i / 2, r = i % 2;
    const int key = seq.key_offset + n_start + j * kMmaN + lane_col;
    const int query = seq.row_offset + (r == 0 ? rows[0] : rows[1]);  // rows[r]: local memory
    const int whole_head = seq.head_offset + head;
    PhiloxBlock draws = dropout_draws(seed, seq.whole_batch, whole_head, query, key / 4);
    bits |= uint32_t(dropout_keeps(d, philox_word(draws, key % 4))) << (4 * j + 2 * r);
    if ((key + 1) % 4 == 0)
      draws = dropout_draws(seed, seq.whole_batch, whole_head, query, (key + 1) / 4);
    bits |= uint32_t(dropout_keeps(d, philox_word(draws, (key + 1) % 4))) << (4 * j + 2 * r + 1);
  }
  return bits;
}

// Rows are keys (dK/dV's transposed tile): entry (j, c) is key keys[c / 2], query
// m_start + 8j + lane_col + c % 2 (local, as above); every entry has its own Philox block.
template <int kTiles>
__device__ __forceinline__ uint32_t keep_bits_by_key_rows(const Dropout& d, const Sequence& seq,
                                                          int head, const int (&keys)[2],
                                                          int m_start, int lane_col) {
  static_assert(kTiles * 4 <= 32, "one bit per entry");
  const DropoutSeed seed = dropout_seed(d);
  uint32_t bits = 0;
#pragma unroll 1
  for (int e = 0; e < 4 * kTiles; ++e) {
    const int j = e / 4, c = e % 4;
    const int query = seq.row_offset + m_start + j * kMmaN + lane_col + c % 2;
    const int key = seq.key_offset + (c < 2 ? keys[0] : keys[1]);
    const PhiloxBlock draws =
        dropout_draws(seed, seq.whole_batch, seq.head_offset + head, query, key / 4);
    bits |= uint32_t(dropout_keeps(d, philox_word(draws, key % 4))) << e;
  }
  return bits;
}

// What the probability of the sequence's local (head, row, key) is multiplied by (one Philox
// call; the SIMT kernels): dropout.h's dropout_factor at the whole attention's coordinates.
__device__ __forceinline__ float dropout_factor_of(const Dropout& d, const DropoutSeed& seed,
                                                   const Sequence& seq, int head, int row,
                                                   int key) {
  return dropout_factor(d, seed, seq.whole_batch, seq.head_offset + head, seq.row_offset + row,
                        seq.key_offset + key);
}

// What entry `bit` of the tile is multiplied by: 1 / (1 - p) if kept, else 0.
__device__ __forceinline__ float kept_factor(const Dropout& d, uint32_t bits, int bit) {
  return (bits >> bit) & 1u ? d.keep_scale : 0.f;
}

}  // namespace flashattn::cuda
