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

// What the row kernels read and write beyond BwdSm90Params: AttnParams' views of O, dO [B, Sq,
// Hq, D], the LSE [B, Hq, Sq] (rows contiguous) and dQ [B, Sq, Hq, D] (written by the convert).
struct BwdSm90Rows {
  TensorView o, dout, lse, dq;
};

// Grid (Sq padded / kRowThreads, Hq, B), Sq the longest sequence's. Row i of sequence b: padded
// rows (i up to the sequence's queries padded to kBlockM) get LSE +inf and D 0, so the main
// kernel's P (and with it dS) is 0 there; a row that sees no key (LSE -inf) gets +inf too (its P
// is 0 for every key, masked or not).
template <typename Elem, int kHeadDim>
__global__ void __launch_bounds__(kRowThreads)
    bwd_sm90_rows_kernel(const BwdSm90Params p, const BwdSm90Rows rows, const DqAccumLayout<kHeadDim> dq_layout) {
  const int i = blockIdx.x * kRowThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  const BwdSm90Seq seq = bwd_sm90_seq<BwdSm90Config<kHeadDim>::kBlockM>(p, b);
  if (i >= DqAccumLayout<kHeadDim>::padded(seq.seqlen_q)) return;
  float lse_log2 = INFINITY, dpsum = 0.f;
  if (i < seq.seqlen_q) {
    const int64_t row = seq.q_row0 + i;
    const uint16_t* o = rows.o.row<const uint16_t>(b, h, row);
    const uint16_t* dout = rows.dout.row<const uint16_t>(b, h, row);
    for (int c = 0; c < kHeadDim; ++c)
      dpsum += cuda::to_float<Elem>(FLASHATTN_GMEM(o)[c]) * cuda::to_float<Elem>(FLASHATTN_GMEM(dout)[c]);
    const float lse = *FLASHATTN_GMEM(rows.lse.row<const float>(b, h, row));
    if (lse != -INFINITY) lse_log2 = lse * 1.4426950408889634f;
  }
  const int64_t stat_row = seq.stat_row0 + i;
  const int64_t stat = dq_layout.stat(seq.map_batch, h, stat_row);
  FLASHATTN_GMEM(p.lse_log2)[stat] = lse_log2;
  FLASHATTN_GMEM(p.dpsum)[stat] = dpsum;
  for (int s = 0; s < dq_layout.slices; ++s)
    for (int c = 0; c < kHeadDim; ++c)
      FLASHATTN_GMEM(p.dq_accum)[dq_layout.element(s, seq.map_batch, h, stat_row, c)] = 0.f;
}

// Grid (ceil(Sq / kRowThreads), Hq, B). The slices are summed in key-block order, so a
// deterministic run's dQ does not depend on which CTA finished first. Rows past a sequence's
// queries are not written (the host fills them: attn_args.cpp prepare_output).
template <typename Elem, int kHeadDim>
__global__ void __launch_bounds__(kRowThreads)
    bwd_sm90_convert_dq_kernel(const BwdSm90Params p, const BwdSm90Rows rows, const DqAccumLayout<kHeadDim> dq_layout) {
  const int i = blockIdx.x * kRowThreads + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  const BwdSm90Seq seq = bwd_sm90_seq<BwdSm90Config<kHeadDim>::kBlockM>(p, b);
  if (i >= seq.seqlen_q) return;
  uint32_t* dq = reinterpret_cast<uint32_t*>(rows.dq.row<uint16_t>(b, h, seq.q_row0 + i));
  const int64_t stat_row = seq.stat_row0 + i;
  for (int c = 0; c < kHeadDim; c += 2) {
    float lo = 0.f, hi = 0.f;
    for (int s = 0; s < dq_layout.slices; ++s) {
      lo += FLASHATTN_GMEM(p.dq_accum)[dq_layout.element(s, seq.map_batch, h, stat_row, c)];
      hi += FLASHATTN_GMEM(p.dq_accum)[dq_layout.element(s, seq.map_batch, h, stat_row, c + 1)];
    }
    FLASHATTN_GMEM(dq)[c / 2] = cuda::pack_rn<Elem>(lo * p.scale, hi * p.scale);
  }
}

}  // namespace flashattn::hopper
