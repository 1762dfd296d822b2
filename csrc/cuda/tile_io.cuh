// Global -> shared copies of a [rows x head-dim tile] block of 16-bit elements.
//
// The fast path is cp.async, 16 bytes per thread per copy, issued by the whole CTA. Rows past
// the sequence end and columns past the real head dim are zero-filled by the copy itself (the
// src-size operand), so tails and padded head dims need no masking of the loaded data and no
// copy of the input. Zeros matter: a masked P_ij is 0 and 0 * NaN would still poison O.
//
// cp.async needs 16-byte aligned sources. Tensors whose base pointer, row stride or head dim
// break that (a head dim that is not a multiple of 8, a slice of packed QKV at an odd offset)
// take the slow path: plain loads and stores of the same bytes, synchronous, which the
// callers' barriers order exactly like a completed cp.async.
#pragma once
#include <cstdint>

#include "../params.h"
#include "element.cuh"
#include "ptx.cuh"
#include "smem_tile.cuh"
#include "traits.h"

namespace flashattn::cuda {

// Whether every row of a 16-bit tensor view starts 16-byte aligned.
__device__ __forceinline__ bool rows_are_16b_aligned(const TensorView& view) {
  const bool base_aligned = reinterpret_cast<uintptr_t>(view.ptr) % kChunkBytes == 0;
  return base_aligned && view.batch_stride % kChunkElems == 0 &&
         view.row_stride % kChunkElems == 0 && view.head_stride % kChunkElems == 0;
}

// The chunks of a [kRows x kCols] tile, 16 bytes each, split over kNThreads threads: thread t
// takes chunks t, t + kNThreads, ... (consecutive threads, consecutive 16 bytes of a row). The
// trip count is a compile-time constant, so a copy can unroll into straight-line code: the
// loop from threadIdx.x it replaces cost ~50 SASS instructions per cp.async in the d = 128
// forward, whose H200 run then stalled on instruction fetch
// (docs/lab/2026-12-01-h200-first-gpu-run.md).
// threadIdx.x is read through ptx::thread_index(), a volatile read, so that its row and column
// are recomputed per copy instead of held across the main loop: with plain threadIdx.x, a
// variant of these copies made the d = 128 forward spill (60 bytes on sm_80, 20 on sm_90).
template <int kRows, int kCols, int kNThreads>
struct TileChunks {
  static constexpr int kPerRow = kCols / kChunkElems;
  static constexpr int kCount = kRows * kPerRow;
  static constexpr int kPerThread = (kCount + kNThreads - 1) / kNThreads;
  static_assert(kCols % kChunkElems == 0, "tile width must be whole 16-byte chunks");

  // Whether this thread's i-th chunk exists (only a partial last pass leaves some out).
  __device__ __forceinline__ static bool exists(int i) {
    return kCount % kNThreads == 0 || ptx::thread_index() + i * kNThreads < kCount;
  }
  // Its row and first column. When a pass of the CTA covers whole rows, the column is the same
  // on every pass and the row advances by a constant.
  __device__ __forceinline__ static int row(int i) {
    if constexpr (kNThreads % kPerRow == 0)
      return ptx::thread_index() / kPerRow + i * (kNThreads / kPerRow);
    return (ptx::thread_index() + i * kNThreads) / kPerRow;
  }
  __device__ __forceinline__ static int col(int i) {
    if constexpr (kNThreads % kPerRow == 0)
      return ptx::thread_index() % kPerRow * kChunkElems;
    return (ptx::thread_index() + i * kNThreads) % kPerRow * kChunkElems;
  }
};

// Copies rows [0, kRows) x columns [0, kCols) of a tile into `tile` (smem_tile.cuh, its shape);
// rows >= rows_valid and columns >= cols_valid become zero. Row r < rows_valid is
// at row_of(r): strided rows of a view, or a sequence's keys wherever a KV cache keeps them
// (pages, cache_batch_idx: kv_rows.h). `anywhere` is any valid address, the source of the
// chunks that read nothing. Must be called by all kNThreads threads of the CTA.
//
// kUnrolled unrolls the cp.async copies, with no bounds at all for a whole tile. The main
// loops ask for it: the forward's K/V tiles (strided rows, and a KV cache's rows in the
// one-m-tile kernel) and the dK/dV kernel's Q/dO tiles. Unrolled copies at every call site
// (the forward's Q tile too) made the d = 128 forward spill on sm_80 (164 bytes, strict ptxas).
//
// kBaseOnce: the rolled loop takes the tile's base into a pointer before the loop rather than
// reading the tile per chunk (the same addresses; through any SmemTile form the forward's key
// copy came out longer); ptxas makes dQ's strided copies longer that way, so load_tile_async
// keeps the per-chunk form (docs/lab/2026-12-03-issue-30-leftovers.md).
template <int kNThreads, bool kUnrolled = false, bool kBaseOnce = true, typename Tile,
          typename RowOf>
__device__ __forceinline__ void load_rows_async(const Tile& tile, const RowOf& row_of,
                                                const uint16_t* anywhere, int rows_valid,
                                                int cols_valid,
                                                bool aligned FLASHATTN_CALLER_SITE) {
  constexpr int kRows = Tile::kRows, kCols = Tile::kCols;
  using Chunks = TileChunks<kRows, kCols, kNThreads>;
  // The bytes of a chunk that hold data: none for a row past rows_valid, fewer than 16 at the
  // head dim's end. An invalid chunk reads nothing, and no out-of-range address is formed.
  auto valid_elems = [&](int row, int col) {
    const int cols_left = row < rows_valid ? cols_valid - col : 0;
    return cols_left < 0 ? 0 : (cols_left < kChunkElems ? cols_left : kChunkElems);
  };
  if (kUnrolled && aligned && rows_valid >= kRows && cols_valid >= kCols) {
#pragma unroll
    for (int i = 0; i < Chunks::kPerThread; ++i) {
      if (!Chunks::exists(i)) continue;
      const int row = Chunks::row(i), col = Chunks::col(i);
      ptx::cp_async_16(tile.at(row, col), row_of(row) + col,
                       kChunkBytes FLASHATTN_CALLER_SITE_ARGS);
    }
    return;
  }
  if (kUnrolled && aligned) {
#pragma unroll
    for (int i = 0; i < Chunks::kPerThread; ++i) {
      if (!Chunks::exists(i)) continue;
      const int row = Chunks::row(i), col = Chunks::col(i), n_valid = valid_elems(row, col);
      ptx::cp_async_16(tile.at(row, col),
                       n_valid > 0 ? row_of(row) + col : anywhere,
                       n_valid * kElemBytes16 FLASHATTN_CALLER_SITE_ARGS);
    }
    return;
  }
  uint16_t* const base = tile.base;
  for (int chunk = threadIdx.x; chunk < Chunks::kCount; chunk += kNThreads) {
    const int row = chunk / Chunks::kPerRow;
    const int col = (chunk % Chunks::kPerRow) * kChunkElems;
    const int n_valid = valid_elems(row, col);
    uint16_t* dst = kBaseOnce ? base + row * Tile::kStride + col : tile.at(row, col);
    const uint16_t* src = n_valid > 0 ? row_of(row) + col : anywhere;
    if (aligned) {
      ptx::cp_async_16(dst, src, n_valid * kElemBytes16 FLASHATTN_CALLER_SITE_ARGS);
    } else {  // plain loads and stores: rare (unaligned views)
#pragma unroll
      for (int e = 0; e < kChunkElems; ++e)
        FLASHATTN_SMEM(dst)[e] = e < n_valid ? src[e] : uint16_t{0};
    }
  }
}

// load_rows_async for rows row_stride apart from tile_gmem ([rows_valid, cols_valid]).
template <int kNThreads, bool kUnrolled = false, typename Tile>
__device__ __forceinline__ void load_tile_async(
    const Tile& tile,
    const uint16_t* tile_gmem,  // [rows_valid, cols_valid], rows row_stride apart
    int64_t row_stride, int rows_valid, int cols_valid, bool aligned FLASHATTN_CALLER_SITE) {
  load_rows_async<kNThreads, kUnrolled, false>(
      tile, [&](int row) { return tile_gmem + row * row_stride; }, tile_gmem, rows_valid,
      cols_valid, aligned FLASHATTN_CALLER_SITE_ARGS);
}

// Copies rows [0, rows_valid) x columns [0, cols_valid) of a tile of 16-bit elements in shared
// memory (its kRows x kCols at most) to global memory, row r to row_of(r): 16 bytes per thread per store
// where the destination rows are 16-byte aligned and the chunk is whole, element by element at a
// ragged head dim or an unaligned view. Must be called by all kNThreads threads, after a barrier
// that made the tile visible to them.
template <int kNThreads, typename Tile, typename RowOf>
__device__ __forceinline__ void store_rows(const Tile& tile, const RowOf& row_of, int rows_valid,
                                           int cols_valid, bool aligned) {
  constexpr int kChunksPerRow = Tile::kCols / kChunkElems;
  constexpr int kChunks = Tile::kRows * kChunksPerRow;
  for (int chunk = threadIdx.x; chunk < kChunks; chunk += kNThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * kChunkElems;
    if (row >= rows_valid || col >= cols_valid) continue;
    const uint16_t* src = tile.at(row, col);
    uint16_t* dst = row_of(row) + col;
    if (aligned && col + kChunkElems <= cols_valid) {
      *FLASHATTN_GMEM(reinterpret_cast<uint4*>(dst)) =
          FLASHATTN_SMEM(reinterpret_cast<const uint4*>(src))[0];
    } else {
      const int n = cols_valid - col < kChunkElems ? cols_valid - col : kChunkElems;
      for (int e = 0; e < n; ++e) FLASHATTN_GMEM(dst)[e] = FLASHATTN_SMEM(src)[e];
    }
  }
}

// Writes a warp's accumulator (16 rows x kNTilesD 8-column n-tiles; this lane: rows acc_row and
// acc_row + 8, columns acc_col and acc_col + 1 of each n-tile) times row_scale[r], rounded to
// Element, into rows [0, 16) of `rows` (a tile in shared memory), one 32-bit store per pair. With a pitch of an odd number of 16-byte chunks the 8 rows x 4 lanes of a store hit 32
// different banks.
template <typename Element, int kNTilesD, typename Tile>
__device__ __forceinline__ void accumulator_to_smem(const float (&acc)[kNTilesD][4],
                                                    const float (&row_scale)[2], int acc_row,
                                                    int acc_col, const Tile& rows) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    uint16_t* row = rows.at(acc_row + r * kMmaM / 2, 0);
#pragma unroll
    for (int d = 0; d < kNTilesD; ++d)
      FLASHATTN_SMEM(reinterpret_cast<uint32_t*>(row + d * kMmaN + acc_col))[0] =
          pack_rn<Element>(acc[d][2 * r] * row_scale[r], acc[d][2 * r + 1] * row_scale[r]);
  }
}

// fp32 rows, for the SIMT kernels (simt_kernels.cuh): plain loads and stores.
// Rows [0, kRows) x columns [0, kCols) of a row-major fp32 view into `tile` (of floats);
// rows >= rows_valid and columns >= cols_valid become 0. All kNThreads threads call it.
// Row r < rows_valid is at row_of(r): strided rows, or keys wherever a KV cache keeps them.
template <int kNThreads, typename Tile, typename RowOf>
__device__ __forceinline__ void load_rows_f32(const Tile& tile, const RowOf& row_of,
                                              int rows_valid, int cols_valid) {
  constexpr int kCols = Tile::kCols;
  for (int i = threadIdx.x; i < Tile::kRows * kCols; i += kNThreads) {
    const int r = i / kCols, c = i % kCols;
    FLASHATTN_SMEM(tile.at(r, c))[0] = r < rows_valid && c < cols_valid ? row_of(r)[c] : 0.f;
  }
}

// load_rows_f32 for rows row_stride apart from rows_gmem ([rows_valid, cols_valid]).
template <int kNThreads, typename Tile>
__device__ __forceinline__ void load_rows_f32(const Tile& tile,
                                              const float* rows_gmem,  // [rows_valid, cols_valid]
                                              int64_t row_stride, int rows_valid,
                                              int cols_valid) {
  load_rows_f32<kNThreads>(
      tile, [&](int r) { return rows_gmem + r * row_stride; }, rows_valid, cols_valid);
}

}  // namespace flashattn::cuda
