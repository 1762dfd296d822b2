// Which key tiles a query tile visits, which of them need masking, and the mask itself, for the
// sm_90a forward. Causal: row i sees key j iff j <= i + diag_offset, where diag_offset is
// Sk - Sq for FA2's bottom-right alignment and 0 for SDPA's top-left one (AttnParams'
// align_bottom_right; causal_diag_offset below). Keys j >= Sk (the zero-filled tail of the
// last tile) are masked in every mode.
//
// The main loop walks the key tiles from the last to the first, as FA3 does, so the tiles that
// need a mask (the causal diagonal and the ragged tail) come first and the loop splits into a
// masked part and an unmasked one, each its own instantiation.
#pragma once
#include <cmath>

#include "cuda/ptx.cuh"

namespace flashattn::hopper {

__host__ __device__ __forceinline__ int causal_diag_offset(bool align_bottom_right, int seqlen_q,
                                                          int seqlen_k) {
  return align_bottom_right ? seqlen_k - seqlen_q : 0;
}

template <bool kCausal, int kBlockM, int kBlockN>
struct KeyTiles {
  int n_blocks;  // key tiles visited: tiles 0 .. n_blocks - 1, walked from the last
  int n_masked;  // the first n_masked visited (the highest tiles) need the mask

  __host__ __device__ __forceinline__ static int floor_div(int a, int b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
  }

  __device__ __forceinline__ KeyTiles(int m_block, int seqlen_q, int seqlen_k, int offset) {
    const int all = (seqlen_k + kBlockN - 1) / kBlockN;
    int full = seqlen_k / kBlockN;  // tiles with no key beyond Sk
    n_blocks = all;
    if (kCausal) {
      const int m0 = m_block * kBlockM;
      const int row_end = m0 + kBlockM < seqlen_q ? m0 + kBlockM : seqlen_q;
      // Keys the tile's last row sees: row_end - 1 + offset + 1.
      const int last_keys = row_end + offset;
      const int visited = last_keys <= 0 ? 0 : (last_keys + kBlockN - 1) / kBlockN;
      n_blocks = visited < all ? visited : all;
      // A tile is unmasked iff the tile's first row sees all its keys: (n + 1) kBlockN <= m0 +
      // offset + 1.
      const int open = floor_div(m0 + offset + 1, kBlockN);
      full = open < full ? (open > 0 ? open : 0) : full;
    }
    if (full > n_blocks) full = n_blocks;
    n_masked = n_blocks - full;
  }
};

// Sets the scores of masked keys to -inf in one warpgroup's m64 x kBlockN accumulator tile:
// row0 is the global query row of this thread's first row (its second is row0 + 8), n0 the
// tile's first key, lane the lane id, offset the causal diagonal's.
template <bool kCausal, int kN>
__device__ __forceinline__ void apply_mask(float (&s)[kN], int row0, int n0, int lane, int seqlen_k,
                                           int offset) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int row = row0 + 8 * ((i % 4) / 2);
    const int key = n0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    const bool masked = key >= seqlen_k || (kCausal && key > row + offset);
    if (masked) s[i] = -INFINITY;
  }
}

}  // namespace flashattn::hopper
