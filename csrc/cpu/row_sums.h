// Horizontal sums for the row products (row_products.cpp): the dot products of a block of
// query rows x keys, each accumulated as a vector of partial sums, reduced to one float each.
// Each sum depends on its own vector only, in a fixed order, so a (row, key) gets the same bits
// however the rows and keys around it are grouped.
#pragma once
#include "simd.h"

namespace flashattn::cpu {

// Query rows and keys of a block of dot products: kDotBlock x kDotBlock.
constexpr int kDotBlock = 4;

// sums[k] = 0 + v[k][0] + v[k][1] + ... + v[k][7], added in that order: the lanes of 8 dot
// products at once, through an 8 x 8 transpose, with the bits of a scalar loop over the lanes.
static_assert(kVecWidth == 8, "lane_sums transposes 8 x 8");
FLASHATTN_ROW_STEP VecF lane_sums(const VecF (&v)[8]) {
  VecF t[8], u[8];
  for (int k = 0; k < 8; k += 2) {  // pairs of rows, interleaved within 128-bit halves
    t[k] = __builtin_shufflevector(v[k], v[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(v[k], v[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4) {  // quads: lanes (l, l + 4) of 4 rows
    u[k] = __builtin_shufflevector(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 1] = __builtin_shufflevector(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[k + 2] = __builtin_shufflevector(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 3] = __builtin_shufflevector(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  VecF lane[8];  // lane[l][k] = v[k][l]
  for (int l = 0; l < 4; ++l) {
    lane[l] = __builtin_shufflevector(u[l], u[l + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    lane[l + 4] = __builtin_shufflevector(u[l], u[l + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  VecF sums = splat(0.f);
  for (int l = 0; l < 8; ++l) sums += lane[l];
  return sums;
}

// The 16 dot products of a 4 x 4 block from 16-lane partial sums, in one vector, row-major
// (lane 4 i + j: row i, key j). A tree of pairs: each level adds lane l + 8, then l + 4, l + 2,
// l + 1 to lane l of every vector while packing two vectors into one, 30 shuffles and 15 adds
// for the block (perf: folding to 8 lanes first and then lane_sums took ~64 and 30, and were
// 45% of dot_key_rows).
FLASHATTN_ROW_STEP VecF16 block_sums(const VecF16 (&acc)[kDotBlock][kDotBlock]) {
  static_assert(kDotBlock == 4, "block_sums reduces 4 x 4 dot products");
  // Slot s holds row s % 4, key s / 4: the tree leaves slot 4 (L % 4) + L / 4 in lane L, which
  // is row L / 4, key L % 4.
  VecF16 halves[8], quarters[4], eighths[2];
  for (int m = 0; m < 8; ++m) {  // lanes l + 8: [a's 8 | b's 8]
    const VecF16 a = acc[(2 * m) % 4][(2 * m) / 4], b = acc[(2 * m + 1) % 4][(2 * m + 1) / 4];
    halves[m] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22,
                                        23) +
                __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                        29, 30, 31);
  }
  for (int m = 0; m < 4; ++m) {  // lanes l + 4: 128-bit blocks 0, 2 of each plus blocks 1, 3
    const VecF16 a = halves[2 * m], b = halves[2 * m + 1];
    quarters[m] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                          26, 27) +
                  __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                                          29, 30, 31);
  }
  for (int m = 0; m < 2; ++m) {  // lanes l + 2, within each 128-bit block
    const VecF16 a = quarters[2 * m], b = quarters[2 * m + 1];
    eighths[m] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13,
                                         28, 29) +
                 __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15,
                                         30, 31);
  }
  const VecF16 a = eighths[0], b = eighths[1];  // lanes l + 1
  return __builtin_shufflevector(a, b, 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28,
                                 30) +
         __builtin_shufflevector(a, b, 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31);
}

// dots[4 i + j] = the sum of acc[i][j]'s lanes.
FLASHATTN_ROW_STEP void block_dots(const VecF16 (&acc)[kDotBlock][kDotBlock],
                                   float (&dots)[kDotBlock * kDotBlock]) {
  store(dots, block_sums(acc));
}
FLASHATTN_ROW_STEP void block_dots(const VecF (&acc)[kDotBlock][kDotBlock],
                                   float (&dots)[kDotBlock * kDotBlock]) {
  for (int half = 0; half < 2; ++half) {
    const VecF pairs[8] = {acc[2 * half][0],     acc[2 * half][1],     acc[2 * half][2],
                           acc[2 * half][3],     acc[2 * half + 1][0], acc[2 * half + 1][1],
                           acc[2 * half + 1][2], acc[2 * half + 1][3]};
    store(dots + 8 * half, lane_sums(pairs));
  }
}

}  // namespace flashattn::cpu
