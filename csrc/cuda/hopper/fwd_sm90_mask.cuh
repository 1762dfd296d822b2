// Which key tiles a query tile visits, which of them need masking, and the mask itself, for the
// sm_90a forward. Causal: row i sees key j iff j <= i + diag_offset, where diag_offset is
// Sk - Sq for FA2's bottom-right alignment and 0 for SDPA's top-left one (AttnParams'
// align_bottom_right; causal_diag_offset below). Keys j >= Sk (the zero-filled tail of the
// last tile) are masked in every mode.
//
// The main loop walks the key tiles from the last to the first, as FA3 does, so the tiles that
// need a mask (the causal diagonal and the ragged tail) come first and the loop splits into a
// masked part and an unmasked one, each its own instantiation (and, with a local window, the
// tiles crossing its left edge come last, masked again).
#pragma once
#include <cmath>

#include "cuda/ptx.cuh"
#include "mask.h"

namespace flashattn::hopper {

__host__ __device__ __forceinline__ int causal_diag_offset(bool align_bottom_right, int seqlen_q,
                                                          int seqlen_k) {
  return align_bottom_right ? seqlen_k - seqlen_q : 0;
}

// The key window of a row: row i sees key j iff j <= i + offset + right (when right >= 0) and
// j >= i + offset - left (when left >= 0): causal is right = 0, left = -1; a local window
// (kLocal, AttnParams' window_left / window_right) any pair.
struct KeyWindow {
  int offset;  // causal_diag_offset()
  int left;    // -1: no left edge
  int right;   // -1: no right edge
};

template <bool kCausal, bool kLocal>
__host__ __device__ __forceinline__ KeyWindow key_window(int offset, int window_left, int window_right) {
  static_assert(!(kCausal && kLocal), "causal is the local window (-1, 0): use one of them");
  return {offset, kLocal ? window_left : -1, kCausal ? 0 : (kLocal ? window_right : -1)};
}

// Query positions [begin, end) of one query tile.
struct QueryRange {
  int begin, end;
};

// The key tiles one query tile visits, walked from the last (n_end - 1) down, and which need
// the mask: visits [0, n_masked) cross the right edge (Sk, the causal diagonal or the window's
// right side) for some row, visits [n_open_end, n_blocks) cross the window's left edge (local
// only), and the visits between are whole tiles every row of the query tile sees. Split-KV
// (keep_part) keeps one contiguous part of those tiles, and the same edges.
template <bool kCausal, bool kLocal, int kBlockM, int kBlockN>
struct KeyTiles {
  int n_end;       // one past the last tile visited
  int n_blocks;    // tiles visited: n_end - n_blocks .. n_end - 1
  int n_masked;    // the first n_masked visits need the mask (right edge)
  int n_open_end;  // visits from here on need it again (left edge); n_blocks without a window
  int open_hi;     // tiles n >= open_hi cross the right edge
  int open_lo;     // tiles n < open_lo cross the left edge

  __host__ __device__ __forceinline__ static int floor_div(int a, int b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
  }
  __host__ __device__ __forceinline__ static int clamp(int x, int lo, int hi) {
    return x < lo ? lo : (x > hi ? hi : x);
  }

  __host__ __device__ __forceinline__ KeyTiles(int m_block, int seqlen_q, int seqlen_k, KeyWindow w)
      : KeyTiles(QueryRange{m_block * kBlockM, m_block * kBlockM + kBlockM < seqlen_q ? m_block * kBlockM + kBlockM
                                                                                     : seqlen_q},
                 seqlen_k, w) {}

  // The query tile of positions rows.begin .. rows.end - 1 (not empty): a packed GQA tile's
  // tokens (fwd_sm90_consumer_tokens).
  __host__ __device__ __forceinline__ KeyTiles(QueryRange rows, int seqlen_k, KeyWindow w) {
    const int m0 = rows.begin, row_end = rows.end;
    const int all = (seqlen_k + kBlockN - 1) / kBlockN;
    int hi = all, lo = 0;
    open_hi = seqlen_k / kBlockN;  // tiles below it hold no key beyond Sk
    if ((kCausal || kLocal) && w.right >= 0) {
      // Keys the last row sees end at row_end - 1 + offset + right (inclusive).
      const int last_keys = row_end + w.offset + w.right;
      hi = clamp(last_keys <= 0 ? 0 : (last_keys + kBlockN - 1) / kBlockN, 0, all);
      // Tile n is whole for the first row iff (n + 1) kBlockN <= m0 + offset + right + 1.
      const int open = floor_div(m0 + w.offset + w.right + 1, kBlockN);
      open_hi = clamp(open, 0, open_hi);
    }
    open_lo = 0;
    if (kLocal && w.left >= 0) {
      // The first row's first key, and tile n whole for the last row iff n kBlockN >=
      // row_end - 1 + offset - left.
      const int first_key = m0 + w.offset - w.left;
      lo = first_key <= 0 ? 0 : first_key / kBlockN;
      const int edge = row_end - 1 + w.offset - w.left;
      open_lo = edge <= 0 ? 0 : (edge + kBlockN - 1) / kBlockN;
    }
    if (lo > hi) lo = hi;
    visit(lo, hi);
  }

  // Visits tiles [lo, hi) only (lo <= hi), with the edges found above.
  __host__ __device__ __forceinline__ void visit(int lo, int hi) {
    n_end = hi;
    n_blocks = hi - lo;
    n_masked = clamp(hi - open_hi, 0, n_blocks);                                 // tiles n >= open_hi
    n_open_end = clamp(hi - (open_lo > lo ? open_lo : lo), n_masked, n_blocks);  // tiles n < open_lo
  }

  // Split-KV: part `part` of `parts` of the tiles, as split_part (mask.h) cuts them on every
  // executor: contiguous, in key order, possibly empty.
  __host__ __device__ __forceinline__ void keep_part(int part, int parts) {
    int lo = n_end - n_blocks, hi = n_end;
    split_part(lo, hi, part, parts);
    visit(lo, hi);
  }
};

// Sets the scores of masked keys to -inf in one warpgroup's m64 x kBlockN accumulator tile:
// row_a and row_b are the query positions of this thread's two rows (the sequence's rows row0 and
// row0 + 8; with packed GQA heads, their tokens), n0 the tile's first key, lane the lane id.
template <bool kCausal, bool kLocal, int kN>
__device__ __forceinline__ void apply_mask(float (&s)[kN], int row_a, int row_b, int n0, int lane, int seqlen_k,
                                           KeyWindow w) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int row = (i % 4) / 2 == 0 ? row_a : row_b;
    const int key = n0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    bool masked = key >= seqlen_k;
    if (kCausal) masked = masked || key > row + w.offset;
    if (kLocal) {
      masked = masked || (w.right >= 0 && key > row + w.offset + w.right) ||
               (w.left >= 0 && key < row + w.offset - w.left);
    }
    if (masked) s[i] = -INFINITY;
  }
}

// Adds ALiBi's -slope * |row + offset - key| (mask.h's alibi_bias, the sm_80 kernels' bias) to
// one warpgroup's tile of logits (natural-log units); row0 this thread's first row (its second
// row0 + 8; never packed GQA rows), keys and lane as in apply_mask.
template <int kN>
__device__ __forceinline__ void apply_alibi(float (&s)[kN], int row0, int n0, int lane, float slope,
                                            int offset) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int row = row0 + 8 * ((i % 4) / 2);
    const int key = n0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    const int dist = row + offset - key;
    s[i] -= slope * static_cast<float>(dist < 0 ? -dist : dist);
  }
}

// Adds attn_mask's bias (score_bias.h mask_bias: the value of a float mask, 0 / -inf of a boolean
// one, in fp32 as the sm_80 kernels add it) to one warpgroup's tile of logits (natural-log units);
// row0 as in apply_alibi, keys and lane as in apply_mask. Entries past the sequence (row >= seqlen_q, key >= seqlen_k)
// are not read: the mask's extent ends there (they are hidden by apply_mask or never stored).
// rows_begin / rows_end are this warpgroup's 64 rows, clipped to the sequence: when every
// kMaskBlock block of the mask the tile touches is open (adds 0), nothing is read, as sm_80's
// kMaskOpen tiles (mask_tile; uniform over the warpgroup, so the branch does not diverge).
template <int kN>
__device__ __forceinline__ void apply_attn_mask(float (&s)[kN], const AttnMask& mask, int batch, int head,
                                                int row0, int n0, int lane, int rows_begin, int rows_end,
                                                int seqlen_k) {
  const int keys_end = n0 + 2 * kN < seqlen_k ? n0 + 2 * kN : seqlen_k;  // kN = kBlockN / 2
  if (rows_begin >= rows_end || n0 >= keys_end) return;
  if (mask_tile(mask, batch, head, rows_begin, rows_end, n0, keys_end) == kMaskOpen) return;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int row = row0 + 8 * ((i % 4) / 2);
    const int key = n0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    if (row < rows_end && key < keys_end) s[i] += mask_bias(mask, batch, head, row, key);
  }
}

}  // namespace flashattn::hopper
