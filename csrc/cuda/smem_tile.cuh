// A tile in shared memory: kRows x kCols elements of T, rows kStride elements apart (issue 30
// item 3; ThunderKittens' st_bf carries the same knowledge in its type). The kernels' tiles pad
// each row by one 16-byte chunk (traits.h, kSmemPadElems) instead of swizzling, so an element's
// address is its row times the stride plus its column, written here once. The copies
// (tile_io.cuh) and the warp products (warp_tile.cuh) take tiles and read their shape and stride
// from the type, so no kernel spells a tile's address arithmetic out.
//
// A tile is one pointer: the shape and stride are compile-time constants, so passing a tile
// costs what passing its pointer did.
#pragma once
#include <cstdint>

namespace flashattn::cuda {

template <int kRows_, int kCols_, int kStride_, typename T = uint16_t>
struct SmemTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;    // columns that hold data
  static constexpr int kStride = kStride_;  // elements from one row's start to the next
  static constexpr int kElems = kRows * kStride;  // its storage
  static_assert(kCols <= kStride, "a row's data fits its pitch");
  using Element = T;

  T* base;  // element (0, 0)

  __device__ __forceinline__ T* at(int row, int col) const { return base + row * kStride + col; }

  // The kSubRows x kSubCols tile whose element (0, 0) is this one's (row, col), with the same
  // stride: a warp's rows or columns of a CTA's tile.
  template <int kSubRows, int kSubCols = kCols>
  __device__ __forceinline__ SmemTile<kSubRows, kSubCols, kStride, T> part(int row,
                                                                          int col) const {
    return {at(row, col)};
  }
  // Rows [row, row + kSubRows), every column.
  template <int kSubRows>
  __device__ __forceinline__ SmemTile<kSubRows, kCols, kStride, T> rows(int row) const {
    return {base + row * kStride};
  }
  // Columns [col, col + kSubCols), every row.
  template <int kSubCols>
  __device__ __forceinline__ SmemTile<kRows, kSubCols, kStride, T> cols(int col) const {
    return {base + col};
  }
};

}  // namespace flashattn::cuda
