// Where each entry of a lane's mma accumulator fragment lies in its tile, written once (issue 30
// item 3; ThunderKittens' rt_fl carries the same knowledge in its type). A warp's accumulator is
// float[kMTiles][kNTiles][4] (warp_tile.cuh): entry c of m-tile m, n-tile j is row
// row0 + 16m + 8(c / 2) and column col0 + 8j + c % 2, where row0 and col0 are the lane's low row
// and first column. The rows are whatever the product's rows are: queries (S = Q K^T) or keys
// (S^T = K Q^T). Only the two origins are held: the kernels' registers are full, so each row and
// column is recomputed where it is used (an add the compiler folds into the unrolled loop).
#pragma once

#include "softmax.cuh"
#include "traits.h"
#include "warp_tile.cuh"

namespace flashattn::cuda {

struct AccFragment {
  int row0;  // the lane's low row of m-tile 0
  int col0;  // the lane's first column of n-tile 0

  // The fragment of a warp tile whose first row and column are (first_row, first_col).
  __device__ __forceinline__ static AccFragment of(const WarpLanes& lanes, int first_row,
                                                   int first_col) {
    return {first_row + lanes.acc_row, first_col + lanes.acc_col};
  }

  __device__ __forceinline__ int row(int m, int c) const {
    return row0 + m * kMmaM + (c / 2) * kRowOffsetHi;
  }
  __device__ __forceinline__ int col(int j, int c) const { return col0 + j * kMmaN + c % 2; }
  // The lane's two rows of m-tile m.
  __device__ __forceinline__ void rows_of(int m, int (&rows)[kRowsPerThread]) const {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) rows[r] = row0 + m * kMmaM + r * kRowOffsetHi;
  }
  // Entry (j, c)'s bit in a per-m-tile mask of one bit per entry (dropout_bits.cuh).
  __device__ __forceinline__ static int bit(int j, int c) { return 4 * j + c; }
  // Which of the lane's two rows (0: low, 1: high) entry `bit` lies in.
  __device__ __forceinline__ static int half(int bit) { return bit % 4 / 2; }

  // f(row, col, x, bit) for every entry x of m-tile m's row of n-tiles, acc_m = acc[m].
  template <int kNTiles, typename F>
  __device__ __forceinline__ void for_each(int m, float (&acc_m)[kNTiles][4], F&& f) const {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) f(row(m, c), col(j, c), acc_m[j][c], bit(j, c));
  }

  // f(row, col, a, b, bit) for every pair of entries at the same place of two accumulators of
  // m-tile m's shape (S and dP).
  template <int kNTiles, typename F>
  __device__ __forceinline__ void for_each(int m, float (&a_m)[kNTiles][4],
                                           float (&b_m)[kNTiles][4], F&& f) const {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) f(row(m, c), col(j, c), a_m[j][c], b_m[j][c], bit(j, c));
  }

  // The same over the whole fragment, m-tile by m-tile.
  template <int kMTiles, int kNTiles, typename F>
  __device__ __forceinline__ void for_each(float (&acc)[kMTiles][kNTiles][4], F&& f) const {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) for_each(m, acc[m], f);
  }
};

}  // namespace flashattn::cuda
