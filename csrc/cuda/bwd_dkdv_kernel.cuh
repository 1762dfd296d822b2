// Backward attention for fp16/bf16 on tensor cores: dK and dV (FlashAttention-2, Algorithm 2).
//
// One CTA owns a key tile Kj, Vj of one (batch, kv head) and keeps dK_j, dV_j in registers
// while it walks every query tile Qi that sees it, for every query head of the GQA group, so
// the group's sum is formed in registers in a fixed order. Each warp owns 16 keys and computes
// the transposed tiles, whose rows are its keys:
//   S_ij^T  = Kj Qi^T                 P_ij^T = exp2(S^T * log2e - LSE_i)   (LSE from the forward)
//   dP_ij^T = Vj dOi^T                dS_ij^T = P_ij^T * (dP_ij^T - D_i) * dlogit/ds
//   dV_j   += P_ij^T dOi              dK_j   += dS_ij^T Qi
// with P^T and dS^T re-packed from accumulators straight into A fragments. For dQ, dS_ij goes
// through shared memory and dQ_i += dS_ij Kj is added with fp32 atomics into an accumulator
// (bwd_row_kernels.cuh converts it), unless the deterministic dQ kernel runs instead.
// Qi, dOi, LSE_i and D_i are streamed through a kStages-deep cp.async ring.
#pragma once
#include <cstdint>

#include "../dropout.h"
#include "dropout_bits.cuh"
#include "../mask.h"
#include "../params.h"
#include "element.cuh"
#include "grid.h"
#include "logit.cuh"
#include "mask_range.cuh"
#include "ptx.cuh"
#include "softmax.cuh"
#include "tile_io.cuh"
#include "traits.h"
#include "warp_tile.cuh"

namespace flashattn::cuda {

template <typename Traits, typename Element, bool ComputeDk, bool ComputeDv>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    bwd_dkdv_kernel_16bit(const AttnBwdParams p,
                          const float* d_gmem,   // D_i (mask.h, query_row_index)
                          float* dq_accum_gmem,  // rows of dq_accum_cols, or nullptr: no dQ
                          int dq_accum_cols) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kDsStride = Traits::kDsSmemStride;
  constexpr int kStages = Traits::kStages;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kNTilesM = kBlockM / kMmaN;  // 8-query n-tiles of S^T
  constexpr int kNTilesD = kHeadDim / kMmaN;
  constexpr int kKStepsD = kHeadDim / kMmaK;
  constexpr int kKStepsN = kBlockN / kMmaK;
  static_assert(ComputeDk || ComputeDv, "nothing to compute");

  const int64_t batch_head_kv = folded_batch_head();
  if (batch_head_kv >= static_cast<int64_t>(p.batch) * p.heads_kv) return;
  const int batch = static_cast<int>(batch_head_kv / p.heads_kv);
  const int head_kv = static_cast<int>(batch_head_kv % p.heads_kv);
  const int n_start = blockIdx.x * kBlockN;
  // The grid covers the longest sequence; CTAs past this one's keys have nothing to do.
  const Sequence seq = sequence_of(p, batch);
  if (n_start >= seq.seqlen_k) return;
  const bool want_dq = ComputeDk && dq_accum_gmem != nullptr;

  FLASHATTN_DYNAMIC_SMEM(uint16_t, smem);
  uint16_t* k_smem = smem;                                     // [kBlockN, kStride]
  uint16_t* v_smem = k_smem + Traits::kKVTileSmemElems;        // [kBlockN, kStride]
  uint16_t* qdo_smem = v_smem + Traits::kKVTileSmemElems;      // kStages x (Qi, dOi)
  uint16_t* ds_smem = qdo_smem + 2 * kStages * Traits::kQTileSmemElems;  // [kBlockM, kDsStride]
  // kStages x [kBlockM] each: LSE_i in log2 units, D_i.
  float* lse_smem = reinterpret_cast<float*>(smem + Traits::kSmem16BitElems);
  float* dsum_smem = lse_smem + kStages * kBlockM;
  auto q_smem = [&](int stage) { return qdo_smem + (2 * stage) * Traits::kQTileSmemElems; };
  auto do_smem = [&](int stage) { return qdo_smem + (2 * stage + 1) * Traits::kQTileSmemElems; };

  const bool aligned =
      p.head_dim % kChunkElems == 0 &&
      rows_are_16b_aligned(p.q) && rows_are_16b_aligned(p.k) && rows_are_16b_aligned(p.v) &&
      rows_are_16b_aligned(p.dout);

  // Query tiles that see this key tile; the same for every head of the group.
  const int key_last = min(n_start + kBlockN, seq.seqlen_k) - 1;
  int row_begin, row_end;
  rows_seeing_keys(seq, n_start, key_last, row_begin, row_end);
  const int m_block_begin = row_begin / kBlockM;
  const int m_blocks = row_end > row_begin ? (row_end + kBlockM - 1) / kBlockM - m_block_begin : 0;
  const int iterations = m_blocks * p.head_group;  // (head in group) x (query tile)

  auto head_of = [&](int it) { return head_kv * p.head_group + it / m_blocks; };
  auto m_start_of = [&](int it) { return (m_block_begin + it % m_blocks) * kBlockM; };
  auto load_q_do = [&](int it) {
    const int stage = it % kStages;
    const int head = head_of(it);
    const int m_start = m_start_of(it);
    const int rows_valid = seq.seqlen_q - m_start;
    const int64_t q_row = seq.q_row0 + m_start;
    load_tile_async<kBlockM, kHeadDim, kStride, kNThreads>(
        q_smem(stage), p.q.row<const uint16_t>(batch, head, q_row), p.q.row_stride, rows_valid,
        p.head_dim, aligned);
    load_tile_async<kBlockM, kHeadDim, kStride, kNThreads>(
        do_smem(stage), p.dout.row<const uint16_t>(batch, head, q_row), p.dout.row_stride,
        rows_valid, p.head_dim, aligned);
    // LSE_i (in log2 units) and D_i: a few floats, plain loads; rows past Sq are masked.
    const int64_t d_row0 = query_row_index(p, seq, head, m_start);
    for (int i = threadIdx.x; i < kBlockM; i += kNThreads) {
      const bool valid = i < rows_valid;
      FLASHATTN_SMEM(lse_smem)[stage * kBlockM + i] =
          valid ? lse_shift_log2(*p.lse.row<const float>(batch, head, q_row + i)) : 0.f;
      FLASHATTN_SMEM(dsum_smem)[stage * kBlockM + i] = valid ? d_gmem[d_row0 + i] : 0.f;
    }
  };

  // Prologue: Kj, Vj and the first kStages - 1 query tiles, one cp.async group per tile.
  const int keys_valid = seq.seqlen_k - n_start;
  load_tile_async<kBlockN, kHeadDim, kStride, kNThreads>(
      k_smem, p.k.row<const uint16_t>(batch, head_kv, seq.k_row0 + n_start), p.k.row_stride,
      keys_valid, p.head_dim, aligned);
  load_tile_async<kBlockN, kHeadDim, kStride, kNThreads>(
      v_smem, p.v.row<const uint16_t>(batch, head_kv, seq.k_row0 + n_start), p.v.row_stride,
      keys_valid, p.head_dim, aligned);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < iterations) load_q_do(s);
    ptx::cp_async_commit();
  }

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int warp_key0 = warp * kMmaM;  // first of this warp's 16 keys within Kj
  int key[kRowsPerThread];             // this lane's two keys (accumulator rows)
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r)
    key[r] = n_start + warp_key0 + lane / 4 + r * kRowOffsetHi;
  const WarpLanes lanes = WarpLanes::of(lane);
  const int lane_col = lanes.acc_col;
  const bool tail_keys = n_start + kBlockN > seq.seqlen_k;

  // One m-tile per warp (its 16 keys): the accumulators are [1][n-tiles][4] (warp_tile.cuh).
  float dk_rmem[1][kNTilesD][4], dv_rmem[1][kNTilesD][4];
  zero_acc(dk_rmem);
  zero_acc(dv_rmem);

  for (int it = 0; it < iterations; ++it) {
    ptx::cp_async_wait<kStages - 2>();
    // Tile `it` (and Kj, Vj) are in smem for every thread; every warp is done with the stage
    // the next copy overwrites and with dS of the previous tile.
    __syncthreads();
    if (it + kStages - 1 < iterations) load_q_do(it + kStages - 1);
    ptx::cp_async_commit();

    const int stage = it % kStages;
    const int head = head_of(it);
    const int m_start = m_start_of(it);
    // attn_mask: a tile it hides is skipped (the whole CTA alike, so the barriers still match).
    const uint8_t mask_class = mask_tile(p.mask, batch, head, m_start,
                                         min(m_start + kBlockM, seq.seqlen_q), n_start,
                                         key_last + 1);
    if (mask_class == kMaskHidden) continue;
    const uint16_t* qi_smem = q_smem(stage);
    const uint16_t* doi_smem = do_smem(stage);
    const float* lse_log2 = lse_smem + stage * kBlockM;
    const float* dsum = dsum_smem + stage * kBlockM;
    const LogitRules rules = LogitRules::make(p, seq, batch, head);

    // S^T = Kj Qi^T and dP^T = Vj dOi^T for this warp's 16 keys.
    // Dropout's decisions for this tile, drawn before the S and dP accumulators are live.
    const uint32_t keep = p.dropout.on() ? keep_bits_by_key_rows<kNTilesM>(
                                               p.dropout, batch, head, key, m_start,
                                               lane_col)
                                         : 0u;
    float s_rmem[1][kNTilesM][4], dp_rmem[1][kNTilesM][4];
    zero_acc(s_rmem);
    mma_ABt<Element, kKStepsD, kStride>(s_rmem, k_smem + warp_key0 * kStride, qi_smem, lanes);
    if constexpr (ComputeDk) {
      zero_acc(dp_rmem);
      mma_ABt<Element, kKStepsD, kStride>(dp_rmem, v_smem + warp_key0 * kStride, doi_smem, lanes);
    }

    // P^T and dS^T, element by element. Only tiles some query of which misses some key (or
    // that hang over Sq or Sk) pay for the mask.
    const int m_last = m_start + kBlockM - 1;
    const bool needs_mask = tail_keys || m_last >= seq.seqlen_q ||
                            first_visible_key(seq, m_last) > n_start ||
                            visible_key_end(seq, m_start) < n_start + kBlockN;
#pragma unroll
    for (int j = 0; j < kNTilesM; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = j * kMmaN + lane_col + c % 2;  // query within Qi
        const int query = m_start + col;
        const int kv = key[c / 2];
        const bool visible = !needs_mask || (query < seq.seqlen_q &&
                                             kv >= first_visible_key(seq, query) &&
                                             kv < visible_key_end(seq, query));
        const bool in_range = query < seq.seqlen_q && kv < seq.seqlen_k;
        float dlogit_ds;
        float x = rules.log2_logit(s_rmem[0][j][c], query, kv, dlogit_ds);
        if (mask_class == kMaskRead && in_range)
          x += mask_bias(p.mask, batch, head, query, kv) * kLog2e;
        const float prob = visible ? ptx::exp2_approx(x - FLASHATTN_SMEM(lse_log2)[col]) : 0.f;
        // Dropout: dV takes the dropped P, dS the dropped dP (P * (dP * Z / (1 - p) - D)).
        const float kept = p.dropout.on() ? kept_factor(p.dropout, keep, 4 * j + c) : 1.f;
        s_rmem[0][j][c] = prob * kept;
        if constexpr (ComputeDk) {
          // dL / dlogit
          const float ds = prob * (dp_rmem[0][j][c] * kept - FLASHATTN_SMEM(dsum)[col]);
          if (p.dmask != nullptr && in_range)
            p.dmask[((static_cast<int64_t>(batch) * p.heads_q + head) * p.seqlen_q + query) *
                        p.seqlen_k + kv] = ds;
          dp_rmem[0][j][c] = ds * dlogit_ds;
        }
      }
    }

    // dV_j += P^T dOi and dK_j += dS^T Qi: P^T and dS^T as A fragments, the query tile through
    // ldmatrix.trans.
    if constexpr (ComputeDv) mma_AB_trans<Element, kStride>(dv_rmem, s_rmem, doi_smem, lanes);
    if constexpr (ComputeDk) mma_AB_trans<Element, kStride>(dk_rmem, dp_rmem, qi_smem, lanes);

    if (want_dq) {
      // dS_ij (query-major) into smem: dS^T's rows are this warp's keys.
#pragma unroll
      for (int j = 0; j < kNTilesM; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int query = j * kMmaN + lane_col + c % 2;
          const int kv = warp_key0 + lane / 4 + (c / 2) * kRowOffsetHi;
          FLASHATTN_SMEM(ds_smem)[query * kDsStride + kv] =
              static_cast<uint16_t>(pack_rn<Element>(dp_rmem[0][j][c], 0.f));
        }
      __syncthreads();
      // dQ_i += dS_ij Kj: warp = (row group of 16 queries, column part); 16 columns at a time
      // so the partial sums stay small, each added to the fp32 accumulator right away.
      const int row_group = warp % Traits::kDqRowGroups;
      const int col_part = warp / Traits::kDqRowGroups;
      float* dq_accum = dq_accum_gmem + query_row_index(p, seq, head, 0) *
                                            dq_accum_cols;  // [Sq, dq_accum_cols]
#pragma unroll
      for (int c0 = 0; c0 < Traits::kDqColsPerWarp; c0 += 2 * kMmaN) {
        const int col0 = col_part * Traits::kDqColsPerWarp + c0;
        float acc[1][2][4];
        zero_acc(acc);
        mma_smem<Element, kKStepsN, kDsStride, kStride, BRows::kRowsAreK>(
            acc, ds_smem + row_group * kMmaM * kDsStride, k_smem + col0, lanes);
        // Each lane's two neighbouring columns go out as one 8-byte reduction: rows of the
        // accumulator are dq_accum_cols (even) floats and the scratch starts 8-byte aligned
        // (grid.h, dq_accum_offset). The pair's second column may be the tile's padding, which
        // nothing reads.
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int h = 0; h < kRowsPerThread; ++h) {
            const int row = m_start + row_group * kMmaM + lane / 4 + h * kRowOffsetHi;
            const int col = col0 + t * kMmaN + lane_col;
            if (row < seq.seqlen_q && col < p.head_dim)
              ptx::red_add_f32x2(dq_accum + static_cast<int64_t>(row) * dq_accum_cols + col,
                                 acc[0][t][2 * h], acc[0][t][2 * h + 1]);
          }
      }
    }
  }
  // Only empty groups can be pending here, unless no query sees this key tile and the loop
  // never ran, leaving Kj and Vj in flight.
  ptx::cp_async_wait_all();

  // Epilogue: dK_j, dV_j (already summed over the GQA group).
  const float unit[kRowsPerThread] = {1.f, 1.f};
  if constexpr (ComputeDk)
    store_accumulator_rows<Element, kNTilesD>(dk_rmem[0], key, unit, seq.seqlen_k, p.head_dim,
                                              lane_col, p.dk, batch, head_kv, seq.k_row0);
  if constexpr (ComputeDv)
    store_accumulator_rows<Element, kNTilesD>(dv_rmem[0], key, unit, seq.seqlen_k, p.head_dim,
                                              lane_col, p.dv, batch, head_kv, seq.k_row0);
}

}  // namespace flashattn::cuda
