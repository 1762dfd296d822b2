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

#include "ptx.cuh"
#include "traits.h"

namespace flashattn::cuda {

// Whether every row of a [rows, head_dim] 16-bit tensor view starts 16-byte aligned.
__device__ __forceinline__ bool rows_are_16b_aligned(const void* ptr, int64_t batch_stride,
                                                     int64_t row_stride, int64_t head_stride) {
  const bool base_aligned = reinterpret_cast<uintptr_t>(ptr) % kChunkBytes == 0;
  return base_aligned && batch_stride % kChunkElems == 0 && row_stride % kChunkElems == 0 &&
         head_stride % kChunkElems == 0;
}

// Copies rows [0, kRows) x columns [0, kCols) of a row-major source into smem with row pitch
// kSmemStride elements; rows >= rows_valid and columns >= cols_valid become zero.
// Must be called by all kNThreads threads of the CTA.
template <int kRows, int kCols, int kSmemStride, int kNThreads>
__device__ __forceinline__ void load_tile_async(uint16_t* tile_smem,        // [kRows, kSmemStride]
                                                const uint16_t* tile_gmem,  // [rows_valid, cols_valid]
                                                int64_t row_stride, int rows_valid,
                                                int cols_valid, bool aligned) {
  constexpr int kChunksPerRow = kCols / kChunkElems;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kCols % kChunkElems == 0, "tile width must be whole 16-byte chunks");
  for (int chunk = threadIdx.x; chunk < kChunks; chunk += kNThreads) {
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * kChunkElems;
    const int cols_left = row < rows_valid ? cols_valid - col : 0;
    const int n_valid = cols_left < 0 ? 0 : (cols_left < kChunkElems ? cols_left : kChunkElems);
    uint16_t* dst = tile_smem + row * kSmemStride + col;
    // An invalid chunk reads nothing; point it at the tile start so no out-of-range address
    // is ever formed.
    const uint16_t* src = n_valid > 0 ? tile_gmem + row * row_stride + col : tile_gmem;
    if (aligned) {
      ptx::cp_async_16(dst, src, n_valid * kElemBytes16);
    } else {
#pragma unroll
      for (int e = 0; e < kChunkElems; ++e) dst[e] = e < n_valid ? src[e] : uint16_t{0};
    }
  }
}

}  // namespace flashattn::cuda
