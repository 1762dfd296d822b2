// The sm_90a backward's row kernels, one thread per query row: before the main kernel, the row
// stats it loads by bulk copy (LSE * log2(e), D = rowsum(dO * O)) and a zeroed dQ accumulator;
// after it, dQ = scale * the accumulator, rounded to the 16-bit type. Plain SIMT code: both are
// memory-bound passes over [B, Sq, Hq, D] (the main kernel reads each row once per key block).
#pragma once
#include <cstdint>

#include "cuda/element.cuh"
#include "cuda/hopper/bwd_sm90_config.h"
#include "cuda/hopper/bwd_sm90_params.h"
#include "cuda/ptx.cuh"

namespace flashattn::hopper {

// What the row kernels read and write beyond BwdSm90Params.
struct BwdSm90Rows {
  const void* o = nullptr;     // [B, Sq, Hq, D]
  const void* dout = nullptr;  // [B, Sq, Hq, D]
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  const float* lse = nullptr;  // [B, Hq, Sq], rows contiguous
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  void* dq = nullptr;  // [B, Sq, Hq, D], written by the convert kernel
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
};

// Grid (Sq padded / kRowThreads, Hq, B). Padded rows get LSE +inf and D 0, so the main kernel's
// P (and with it dS) is 0 there; a row that sees no key (LSE -inf) gets +inf too (its P is 0
// for every key, masked or not).
template <typename Elem, int kHeadDim>
__global__ void __launch_bounds__(kRowThreads)
    bwd_sm90_rows_kernel(const BwdSm90Params p, const BwdSm90Rows rows, const DqAccumLayout<kHeadDim> dq_layout) {
  const int i = blockIdx.x * kRowThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= dq_layout.seqlen_q_padded) return;
  float lse_log2 = INFINITY, dpsum = 0.f;
  if (i < p.seqlen_q) {
    const uint16_t* o = static_cast<const uint16_t*>(rows.o) + b * rows.o_batch_stride + i * rows.o_row_stride +
                        h * rows.o_head_stride;
    const uint16_t* dout = static_cast<const uint16_t*>(rows.dout) + b * rows.do_batch_stride +
                           i * rows.do_row_stride + h * rows.do_head_stride;
    for (int c = 0; c < kHeadDim; ++c)
      dpsum += cuda::to_float<Elem>(FLASHATTN_GMEM(o)[c]) * cuda::to_float<Elem>(FLASHATTN_GMEM(dout)[c]);
    const float lse = FLASHATTN_GMEM(rows.lse)[b * rows.lse_batch_stride + h * rows.lse_head_stride + i];
    if (lse != -INFINITY) lse_log2 = lse * 1.4426950408889634f;
  }
  const int64_t stat = (static_cast<int64_t>(b) * p.heads_q + h) * dq_layout.seqlen_q_padded + i;
  FLASHATTN_GMEM(p.lse_log2)[stat] = lse_log2;
  FLASHATTN_GMEM(p.dpsum)[stat] = dpsum;
  for (int s = 0; s < dq_layout.slices; ++s)
    for (int c = 0; c < kHeadDim; ++c) FLASHATTN_GMEM(p.dq_accum)[dq_layout.element(s, b, h, i, c)] = 0.f;
}

// Grid (ceil(Sq / kRowThreads), Hq, B). The slices are summed in key-block order, so a
// deterministic run's dQ does not depend on which CTA finished first.
template <typename Elem, int kHeadDim>
__global__ void __launch_bounds__(kRowThreads)
    bwd_sm90_convert_dq_kernel(const BwdSm90Params p, const BwdSm90Rows rows, const DqAccumLayout<kHeadDim> dq_layout) {
  const int i = blockIdx.x * kRowThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seqlen_q) return;
  uint32_t* dq = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(rows.dq) + b * rows.dq_batch_stride +
                                             i * rows.dq_row_stride + h * rows.dq_head_stride);
  for (int c = 0; c < kHeadDim; c += 2) {
    float lo = 0.f, hi = 0.f;
    for (int s = 0; s < dq_layout.slices; ++s) {
      lo += FLASHATTN_GMEM(p.dq_accum)[dq_layout.element(s, b, h, i, c)];
      hi += FLASHATTN_GMEM(p.dq_accum)[dq_layout.element(s, b, h, i, c + 1)];
    }
    FLASHATTN_GMEM(dq)[c / 2] = cuda::pack_rn<Elem>(lo * p.scale, hi * p.scale);
  }
}

}  // namespace flashattn::hopper
