// The backward's epilogue, shared by its kernels: where a gradient's rows go and how a warp's
// accumulator is written to them (fwd_epilogue.cuh is the forward's).
//   dK, dV  rows of one (batch, kv head), keys counted from the sequence's first key: the 16-bit
//           dK/dV kernel's accumulators (summed over the GQA group already) and the SIMT one's;
//   dQ      rows of one (batch, query head), queries counted from the sequence's first query:
//           the deterministic dQ kernel's accumulator, the SIMT dQ kernel's rows, and
//           bwd_convert_dq_kernel's rounding of the fp32 accumulator the dK/dV kernel adds into.
// With grads_fp32 (params.h) the 16-bit kernels' gradients go out as float32, unrounded.
#pragma once
#include <cstdint>

#include "../params.h"
#include "../sequence.h"
#include "element.cuh"
#include "ptx.cuh"
#include "softmax.cuh"
#include "traits.h"

namespace flashattn::cuda {

// The rows of one (batch, head) of a gradient view ([B, S, H, D], last dim contiguous), from a
// sequence's first row on.
struct GradRows {
  const TensorView& view;  // a kernel parameter's field, outliving this
  int batch, head;
  int64_t row0;

  __device__ __forceinline__ static GradRows dq(const AttnBwdParams& p, const Sequence& seq,
                                                int batch, int head) {
    return {p.dq, batch, head, seq.q_row0};
  }
  __device__ __forceinline__ static GradRows dk(const AttnBwdParams& p, const Sequence& seq,
                                                int batch, int head_kv) {
    return {p.dk, batch, head_kv, seq.k_row0};
  }
  __device__ __forceinline__ static GradRows dv(const AttnBwdParams& p, const Sequence& seq,
                                                int batch, int head_kv) {
    return {p.dv, batch, head_kv, seq.k_row0};
  }

  // Row r of the sequence, of the view's element type T.
  template <typename T>
  __device__ __forceinline__ T* row(int r) const {
    return view.row<T>(batch, head, row0 + r);
  }
};

// Writes an m-tile of a warp's accumulator (acc_m: this lane's rows row[0], row[1], counted from
// the sequence's first, and columns lane_col, lane_col + 1 of each 8-column n-tile; AccFragment
// gives both) as Element into rows [0, rows_valid) x columns [0, cols_valid) of `to`.
// as_float: the view is float32 instead (grads_fp32), and the values go out unrounded.
template <typename Element, int kNTiles>
__device__ __forceinline__ void store_grad_rows(const float (&acc_m)[kNTiles][4],
                                                const int (&row)[kRowsPerThread], int lane_col,
                                                int rows_valid, int cols_valid,
                                                const GradRows& to, bool as_float) {
  const TensorView& dst = to.view;
  // One element offset serves both element sizes, so the float32 path adds no index math of
  // its own (a separate float32 loop made the d = 64 dK/dV kernel spill on sm_90).
  const int64_t head_offset = to.row<uint16_t>(0) - static_cast<uint16_t*>(dst.ptr);
  uint16_t* out = static_cast<uint16_t*>(dst.ptr) + head_offset;
  const int64_t row_stride = dst.row_stride;
  // Two neighbouring elements go out as one 32-bit store when every row start is 4-byte aligned.
  const bool pair_aligned = reinterpret_cast<uintptr_t>(dst.ptr) % sizeof(uint32_t) == 0 &&
                            dst.batch_stride % 2 == 0 && row_stride % 2 == 0 &&
                            dst.head_stride % 2 == 0;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    if (row[r] >= rows_valid) continue;
    uint16_t* out_row = out + row[r] * row_stride;
#pragma unroll
    for (int d = 0; d < kNTiles; ++d) {
      const int col = d * kMmaN + lane_col;
      if (col >= cols_valid) continue;
      const float lo = acc_m[d][2 * r], hi = acc_m[d][2 * r + 1];
      if (as_float) {
        float* out_f = static_cast<float*>(dst.ptr) + head_offset + row[r] * row_stride + col;
        FLASHATTN_GMEM(out_f)[0] = lo;
        if (col + 1 < cols_valid) FLASHATTN_GMEM(out_f)[1] = hi;
        continue;
      }
      const uint32_t pair = pack_rn<Element>(lo, hi);
      if (pair_aligned && col + 1 < cols_valid) {
        *FLASHATTN_GMEM(reinterpret_cast<uint32_t*>(out_row + col)) = pair;
      } else {
        FLASHATTN_GMEM(out_row)[col] = static_cast<uint16_t>(pair);
        if (col + 1 < cols_valid) FLASHATTN_GMEM(out_row)[col + 1] = static_cast<uint16_t>(pair >> 16);
      }
    }
  }
}

}  // namespace flashattn::cuda
