// Deterministic dQ for fp16/bf16 (used when deterministic=True): the forward's shape, with
// dQ_i in registers where the forward keeps O_i. One CTA owns a query tile Qi (and dOi) and
// walks the key tiles it sees in a fixed order, so dQ is bitwise reproducible:
//   S_ij = Qi Kj^T,  dP_ij = dOi Vj^T,  P_ij = exp2(S * log2e - LSE_i),
//   dS_ij = P_ij * (dP_ij - D_i) * dlogit/ds,  dQ_i += dS_ij Kj.
// It recomputes S and dP, which the dK/dV kernel's atomic dQ path avoids.
#pragma once
#include <cstddef>
#include <cstdint>

#include "../mask.h"
#include "../params.h"
#include "bwd_epilogue.cuh"
#include "element.cuh"
#include "grid.h"
#include "mask_range.cuh"
#include "ptx.cuh"
#include "score_rules.cuh"
#include "smem_tile.cuh"
#include "softmax.cuh"
#include "tile_io.cuh"
#include "tile_scheduler.cuh"
#include "traits.h"
#include "warp_tile.cuh"

namespace flashattn::cuda {

template <typename Traits, typename Element>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    bwd_dq_kernel_16bit(const AttnBwdParams p, const float* d_gmem /* D_i, by query_row_index */) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kHeadDimV = Traits::kHeadDimV;
  constexpr int kVStride = Traits::kVSmemStride;
  constexpr int kStages = Traits::kStages;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kNTilesN = kBlockN / kMmaN;
  constexpr int kNTilesD = kHeadDim / kMmaN;

  if (!in_grid<TileAxis::kQueries>(p)) return;
  const auto work = work_tile<TileAxis::kQueries, kBlockM>(p);
  if (work.past_end()) return;
  const Sequence seq = work.seq;
  const int batch = work.batch, head = work.head, head_kv = work.head_kv, m_start = work.start;

  // Q, K over head_dim columns of the tile's kHeadDim, V, dO over head_dim_v of its kHeadDimV
  // (MLA: BwdDqPairTraits; plan_fwd.h, tile_head_dim).
  const bool aligned =
      p.head_dim % kChunkElems == 0 && p.head_dim_v % kChunkElems == 0 &&
      rows_are_16b_aligned(p.q) && rows_are_16b_aligned(p.k) && rows_are_16b_aligned(p.v) &&
      rows_are_16b_aligned(p.dout);
  // [Sk, D] views of this (batch, kv head).
  const uint16_t* k_gmem = p.k.row<const uint16_t>(batch, head_kv, seq.k_row0);
  const uint16_t* v_gmem = p.v.row<const uint16_t>(batch, head_kv, seq.k_row0);

  FLASHATTN_DYNAMIC_SMEM(uint16_t, smem);
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);  // traits.h
  const SmemTile<kBlockM, kHeadDim, kStride> q_tile{shared.q};
  const SmemTile<kBlockM, kHeadDimV, kVStride> do_tile{shared.dout};
  // kStages x (K tile, V tile), indexed from the first stage's K in elements:
  // `shared.stages[stage].k`, the same addresses, added more registers' worth of address
  // arithmetic in the loop.
  using KTile = SmemTile<kBlockN, kHeadDim, kStride>;
  using VTile = SmemTile<kBlockN, kHeadDimV, kVStride>;
  using Stage = typename Traits::Stage;
  constexpr int kStageElems = sizeof(Stage) / sizeof(uint16_t);
  constexpr int kVElems = offsetof(Stage, v) / sizeof(uint16_t);
  uint16_t* kv_smem = shared.stages[0].k;
  auto k_tile = [&](int stage) { return KTile{kv_smem + stage * kStageElems}; };
  auto v_tile = [&](int stage) { return VTile{kv_smem + stage * kStageElems + kVElems}; };

  const int m_last = min(m_start + kBlockM, seq.seqlen_q) - 1;
  const KeyTiles<kBlockN> tiles = KeyTiles<kBlockN>::of(seq, m_start, m_last);
  const int tile_begin = tiles.begin, tile_end = tiles.end;

  auto load_kv = [&](int tile) {
    const int stage = (tile - tile_begin) % kStages;
    const int n_start = tile * kBlockN;
    load_tile_async<kNThreads>(
        k_tile(stage), k_gmem + n_start * p.k.row_stride, p.k.row_stride, seq.seqlen_k - n_start,
        p.head_dim, aligned);
    load_tile_async<kNThreads>(
        v_tile(stage), v_gmem + n_start * p.v.row_stride, p.v.row_stride, seq.seqlen_k - n_start,
        p.head_dim_v, aligned);
  };

  const int rows_valid = seq.seqlen_q - m_start;
  load_tile_async<kNThreads>(
      q_tile, p.q.row<const uint16_t>(batch, head, seq.q_row0 + m_start), p.q.row_stride, rows_valid,
      p.head_dim, aligned);
  load_tile_async<kNThreads>(
      do_tile, p.dout.row<const uint16_t>(batch, head, seq.q_row0 + m_start), p.dout.row_stride,
      rows_valid, p.head_dim_v, aligned);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (tile_begin + s < tile_end) load_kv(tile_begin + s);
    ptx::cp_async_commit();
  }

  const int warp = threadIdx.x / kWarpSize;
  const WarpLanes lanes = WarpLanes::of(threadIdx.x % kWarpSize);
  const int warp_row0 = warp * kMmaM;
  // This lane's rows of the warp's S, dP and dQ accumulators (acc_fragment.cuh).
  int row[kRowsPerThread];
  AccFragment::of(lanes, m_start + warp_row0, 0).rows_of(0, row);
  float lse_log2[kRowsPerThread], dsum[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const bool valid = row[r] < seq.seqlen_q;
    lse_log2[r] =
        valid ? lse_shift_log2(*p.lse.row<const float>(batch, head, seq.q_row0 + row[r])) : 0.f;
    dsum[r] = valid ? d_gmem[query_row_index(p, seq, head, row[r])] : 0.f;
  }
  const ScoreRules rules = ScoreRules::make(p, seq, batch, head);

  float dq_rmem[1][kNTilesD][4];  // one m-tile per warp (traits.h)
  zero_acc(dq_rmem);

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // tile ready for all; the stage the next copy overwrites is free
    if (tile + kStages - 1 < tile_end) load_kv(tile + kStages - 1);
    ptx::cp_async_commit();

    const int n_start = tile * kBlockN;
    const uint8_t mask_class = mask_tile(p.mask, batch, head, m_start, m_last + 1, n_start,
                                         min(n_start + kBlockN, seq.seqlen_k));
    if (mask_class == kMaskHidden) continue;  // attn_mask hides the tile
    const int stage = (tile - tile_begin) % kStages;
    const KTile kj_tile = k_tile(stage);
    const VTile vj_tile = v_tile(stage);

    // Dropout's decisions for this tile, drawn before the S and dP accumulators are live.
    const uint32_t keep =
        rules.dropout_on() ? rules.keep_bits_by_query_rows<kNTilesN>(row, n_start, lanes.acc_col)
                           : 0u;
    // S_ij = Qi Kj^T and dP_ij = dOi Vj^T for this warp's 16 rows.
    float s_rmem[1][kNTilesN][4], dp_rmem[1][kNTilesN][4];
    zero_acc(s_rmem);
    zero_acc(dp_rmem);
    mma_ABt<Element>(s_rmem, q_tile.template rows<kMmaM>(warp_row0), kj_tile, lanes);
    mma_ABt<Element>(dp_rmem, do_tile.template rows<kMmaM>(warp_row0), vj_tile, lanes);

    // dP_ij becomes dS_ij (score_rules.cuh, steps 1-6 and the chain rule), entry by entry.
    const ScoreTile score_tile{mask_class, tiles.needs_mask(tile)};
    const AccFragment s_frag = AccFragment::of(lanes, m_start + warp_row0, n_start);
    s_frag.for_each(0, s_rmem[0], dp_rmem[0], [&](int q_row, int key, float s, float& dp, int bit) {
      const int r = AccFragment::half(bit);
      const ScoreGrad g = rules.backward<true, false>(s, dp, q_row, key, score_tile, lse_log2[r],
                                               dsum[r], rules.kept(keep, bit));
      dp = g.dlogit * g.dlogit_ds;
    });

    // dQ_i += dS_ij Kj: dS from the accumulator as A fragments, Kj through ldmatrix.trans.
    mma_AB_trans<Element>(dq_rmem, dp_rmem, kj_tile, lanes);
  }
  ptx::cp_async_wait_all();

  // Epilogue: dQ_i, this warp's rows (bwd_epilogue.cuh).
  store_grad_rows<Element>(dq_rmem[0], row, lanes.acc_col, seq.seqlen_q, p.head_dim,
                           GradRows::dq(p, seq, batch, head), p.grads_fp32);
}

}  // namespace flashattn::cuda
