// One warp's tensor-core tile arithmetic, written once for every 16-bit kernel, so that each
// kernel's main loop reads as its algorithm (S = Q K^T, O += P V, ...).
//
// Shapes. mma.m16n8k16 multiplies a 16x16 A fragment by a 16x8 B fragment into a 16x8 fp32
// accumulator. A warp's accumulator here is float[kMTiles][kNTiles][4]: kMTiles m-tiles of 16
// rows times kNTiles n-tiles of 8 columns. Lane L holds rows L/4 and L/4 + 8 of each m-tile and
// columns 2(L%4), 2(L%4) + 1 of each n-tile: acc[m][j][0..1] the low row, [2..3] the high row.
//
// Operands come from shared memory tiles of 16-bit elements (smem_tile.cuh: the tile's type
// holds its stride) through ldmatrix (x4: four 8x8 matrices per instruction, one row address per lane). One B
// fragment loaded by a warp feeds all kMTiles m-tiles: that reuse is what more rows per warp
// buys (traits.h, FwdTraits).
#pragma once
#include <cstdint>

#include "element.cuh"
#include "ptx.cuh"
#include "smem_tile.cuh"
#include "traits.h"

namespace flashattn::cuda {

// Which row and column of an ldmatrix.x4 a lane addresses, and where its accumulator lives.
struct WarpLanes {
  // A operand (16 rows x 16 at column k): lanes 0-15 give rows 0-15 at k, lanes 16-31 rows 0-15
  // at k + 8. The same map serves a B operand read with .trans (16 rows of K-dim x two 8-column
  // n-tiles) and the C-fragment row-major layout of P for O += P V.
  int a_row, a_col;
  // B operand (two 8-row n-tiles x 16 at column k): matrices (rows 0-7, k), (0-7, k + 8),
  // (8-15, k), (8-15, k + 8) -> b0, b1 of n-tile 2t and b0, b1 of n-tile 2t + 1.
  int b_row, b_col;
  // Accumulator: this lane's low row (lane / 4; the high one is 8 further) and its first column
  // in an 8-column n-tile.
  int acc_row, acc_col;

  __device__ __forceinline__ static WarpLanes of(int lane) {
    return {lane % 16,         (lane / 16) * 8, lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8,
            lane / 4,          2 * (lane % 4)};
  }
};

template <int kMTiles, int kNTiles>
__device__ __forceinline__ void zero_acc(float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][j][c] = 0.f;
}

// How an A operand lies in shared memory (row-major either way):
//   kRowsAreM: one row per output row (Q for S = Q K^T), read with ldmatrix;
//   kRowsAreK: one row per k, i.e. the operand's transpose (dS^T for dQ = dS K in the
//              backward), read with ldmatrix.trans: each 8x8 block comes out transposed, so the
//              four blocks are addressed with the B lane map (blocks (k, m), (k, m + 8),
//              (k + 8, m), (k + 8, m + 8) -> a0..a3).
enum class ARows { kRowsAreM, kRowsAreK };

// The A fragments of k-step k for kMTiles m-tiles of 16 rows of a_tile.
template <ARows kLayout = ARows::kRowsAreM, int kMTiles, typename Tile>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[kMTiles][4], const Tile& a_tile, int k,
                                             const WarpLanes& lanes) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    if constexpr (kLayout == ARows::kRowsAreM) {
      ptx::ldmatrix_x4(a[m][0], a[m][1], a[m][2], a[m][3],
                       a_tile.at(m * kMmaM + lanes.a_row, k * kMmaK + lanes.a_col));
    } else {
      ptx::ldmatrix_x4_trans(a[m][0], a[m][1], a[m][2], a[m][3],
                             a_tile.at(k * kMmaK + lanes.b_row, m * kMmaM + lanes.b_col));
    }
  }
}

// acc[m][j] and acc[m][j + 1] += a[m] times the two B fragments of n-tiles j, j + 1, for every
// m-tile: one B load feeds kMTiles x 2 mma.
template <typename Element, int kMTiles, int kNTiles>
__device__ __forceinline__ void mma_n_pair(float (&acc)[kMTiles][kNTiles][4], int j,
                                           const uint32_t (&a)[kMTiles][4],
                                           const uint32_t (&b)[2][2]) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    mma_16816<Element>(acc[m][j], a[m], b[0]);
    mma_16816<Element>(acc[m][j + 1], a[m], b[1]);
  }
}

// How a B operand lies in shared memory (row-major either way):
//   kRowsAreN: one row per output column (K for S = Q K^T: the mma's column-major B is its
//              transpose), read with ldmatrix;
//   kRowsAreK: one row per k (V for O = P V), read with ldmatrix.trans.
enum class BRows { kRowsAreN, kRowsAreK };

// The B fragments of n-tiles n and n + 1 at k-step k: one ldmatrix.x4, b[t] for n-tile n + t.
template <BRows kLayout, typename Tile>
__device__ __forceinline__ void load_b_pair(uint32_t (&b)[2][2], const Tile& b_tile, int k, int n,
                                            const WarpLanes& lanes) {
  if constexpr (kLayout == BRows::kRowsAreN) {
    ptx::ldmatrix_x4(b[0][0], b[0][1], b[1][0], b[1][1],
                     b_tile.at(n * kMmaN + lanes.b_row, k * kMmaK + lanes.b_col));
  } else {
    ptx::ldmatrix_x4_trans(b[0][0], b[0][1], b[1][0], b[1][1],
                           b_tile.at(k * kMmaK + lanes.a_row, n * kMmaN + lanes.a_col));
  }
}

// acc += a B for one k-step k: a holds the A fragments of the k-step (kMTiles m-tiles), B's
// kNTiles n-tiles are loaded two at a time (kLayout as load_b_pair says), each load feeding
// kMTiles x 2 mma. The inner step of every product below.
template <typename Element, BRows kLayout, int kMTiles, int kNTiles, typename BTile>
__device__ __forceinline__ void mma_k_step(float (&acc)[kMTiles][kNTiles][4],
                                           const uint32_t (&a)[kMTiles][4], const BTile& b_tile,
                                           int k, const WarpLanes& lanes) {
  static_assert(kNTiles % 2 == 0, "B is loaded two n-tiles per ldmatrix.x4");
#pragma unroll
  for (int n = 0; n < kNTiles; n += 2) {
    uint32_t b[2][2];
    load_b_pair<kLayout>(b, b_tile, k, n, lanes);
    mma_n_pair<Element>(acc, n, a, b);
  }
}

// acc += A B with both operands in shared memory, over kKSteps 16-wide k-steps:
//   A: kMTiles x 16 rows laid out as kALayout says (this warp's rows),
//   B: kNTiles x 8 output columns laid out as kLayout says.
// Per k-step: kMTiles ldmatrix.x4 for A, kNTiles / 2 for B, kMTiles x kNTiles mma.
template <typename Element, int kKSteps, BRows kLayout, ARows kALayout = ARows::kRowsAreM,
          int kMTiles, int kNTiles, typename ATile, typename BTile>
__device__ __forceinline__ void mma_smem(float (&acc)[kMTiles][kNTiles][4], const ATile& a_tile,
                                         const BTile& b_tile, const WarpLanes& lanes) {
#pragma unroll
  for (int k = 0; k < kKSteps; ++k) {
    uint32_t a[kMTiles][4];
    load_a_frags<kALayout>(a, a_tile, k, lanes);
    mma_k_step<Element, kLayout>(acc, a, b_tile, k, lanes);
  }
}

// acc += A B over k-steps [k0, k0 + kKSteps) with A already in registers (a[kk][m]: the A
// fragments of k-step k0 + kk, m-tile m) and B's rows being k (ldmatrix.trans). The backward's
// dV += P^T dO and dK += dS^T Q for the queries whose P^T a warp has just computed itself.
template <typename Element, int kKSteps, int kMTiles, int kNTiles, typename BTile>
__device__ __forceinline__ void mma_regs_AB(float (&acc)[kMTiles][kNTiles][4],
                                            const uint32_t (&a)[kKSteps][kMTiles][4], int k0,
                                            const BTile& b_tile, const WarpLanes& lanes) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk)
    mma_k_step<Element, BRows::kRowsAreK>(acc, a[kk], b_tile, k0 + kk, lanes);
}

// acc += A B over kGroups groups of kGroupKSteps k-steps each except group `skip` (the one
// mma_regs_AB took from registers), A from a_tile (rows are this warp's M rows), B's rows being
// k (ldmatrix.trans). Groups in a fixed order per warp, so the sum is deterministic.
template <typename Element, int kGroups, int kGroupKSteps, int kMTiles, int kNTiles,
          typename ATile, typename BTile>
__device__ __forceinline__ void mma_smem_AB_except(float (&acc)[kMTiles][kNTiles][4], int skip,
                                                   const ATile& a_tile, const BTile& b_tile,
                                                   const WarpLanes& lanes) {
#pragma unroll
  for (int g = 1; g < kGroups; ++g) {
    const int group = (skip + g) % kGroups;
#pragma unroll
    for (int kk = 0; kk < kGroupKSteps; ++kk) {
      const int k = group * kGroupKSteps + kk;
      uint32_t a[kMTiles][4];
      load_a_frags(a, a_tile, k, lanes);
      mma_k_step<Element, BRows::kRowsAreK>(acc, a, b_tile, k, lanes);
    }
  }
}

// acc += A B^T over the tiles' columns in 16-wide k-steps, A = kMTiles x 16 rows of a_tile,
// B = kNTiles x 8 rows of b_tile: the shape of S = Q K^T, S^T = K Q^T and dP = dO V^T.
template <typename Element, int kMTiles, int kNTiles, typename ATile, typename BTile>
__device__ __forceinline__ void mma_ABt(float (&acc)[kMTiles][kNTiles][4], const ATile& a_tile,
                                        const BTile& b_tile, const WarpLanes& lanes) {
  static_assert(ATile::kCols == BTile::kCols && ATile::kCols % kMmaK == 0,
                "A and B share their k columns, whole k-steps");
  mma_smem<Element, ATile::kCols / kMmaK, BRows::kRowsAreN>(acc, a_tile, b_tile, lanes);
}

// The accumulator's n-tiles (2k, 2k + 1), rounded to Element, are exactly the A fragment of
// k-step k of a product with it on the left: a0/a1 = low/high row of columns 0-7, a2/a3 = of
// columns 8-15. No shuffle, no shared memory.
template <typename Element, int kNTiles>
__device__ __forceinline__ void acc_to_a_frag(const float (&acc)[kNTiles][4], int k,
                                              uint32_t (&a)[4]) {
  a[0] = pack_rn<Element>(acc[2 * k][0], acc[2 * k][1]);
  a[1] = pack_rn<Element>(acc[2 * k][2], acc[2 * k][3]);
  a[2] = pack_rn<Element>(acc[2 * k + 1][0], acc[2 * k + 1][1]);
  a[3] = pack_rn<Element>(acc[2 * k + 1][2], acc[2 * k + 1][3]);
}

// out += P B, P an accumulator of this warp (kMTiles x 16 rows, kNTilesP x 8 columns) used as
// the A operand, B = rows 0 .. 8 kNTilesP of b_tile (row-major, kNTilesOut x 8 columns) read
// with ldmatrix.trans. Per 16-row k-step: kNTilesOut / 2 ldmatrix.x4.trans, shared by the
// kMTiles m-tiles.
template <typename Element, int kMTiles, int kNTilesP, int kNTilesOut, typename BTile>
__device__ __forceinline__ void mma_AB_trans(float (&out)[kMTiles][kNTilesOut][4],
                                             const float (&p)[kMTiles][kNTilesP][4],
                                             const BTile& b_tile, const WarpLanes& lanes) {
  static_assert(kNTilesP % 2 == 0 && kNTilesOut % 2 == 0, "whole 16x16 fragments");
#pragma unroll
  for (int k = 0; k < kNTilesP / 2; ++k) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) acc_to_a_frag<Element>(p[m], k, a[m]);
    mma_k_step<Element, BRows::kRowsAreK>(out, a, b_tile, k, lanes);
  }
}

}  // namespace flashattn::cuda
