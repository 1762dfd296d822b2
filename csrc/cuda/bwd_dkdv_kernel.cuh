// Backward attention for fp16/bf16 on tensor cores: dK and dV (FlashAttention-2, Algorithm 2).
//
// One CTA owns a key tile Kj, Vj of one (batch, kv head) and keeps dK_j, dV_j in registers
// while it walks every query tile Qi that sees it, for every query head of the GQA group, so
// the group's sum is formed in registers in a fixed order. Per query tile, in three products
// with three warp grids (traits.h, BwdTraits):
//   S_ij^T  = Kj Qi^T                 P_ij^T = exp2(S^T * log2e - LSE_i)   (LSE from the forward)
//   dP_ij^T = Vj dOi^T                dS_ij^T = P_ij^T * (dP_ij^T - D_i) * dlogit/ds
//       (P^T and dS^T to shared memory)
//   dV_j   += P_ij^T dOi              dK_j   += dS_ij^T Qi
//   dQ_i   += dS_ij Kj                (fp32 atomics into an accumulator that
//                                      bwd_row_kernels.cuh converts, unless the deterministic
//                                      dQ kernel runs instead)
// S^T has keys as rows, so each lane's entries share its key rows, and LSE_i, D_i are read per
// column. dQ reads dS out of dS^T's rows with ldmatrix.trans.
// A value head dim of its own (MLA): Kj, Qi, dK, dQ are the tile's kHeadDim wide, Vj, dOi, dV
// its kHeadDimV (BwdPairTraits; an equal tile where the pair has none of its own, plan_fwd.h),
// read over head_dim and head_dim_v columns, zero-filled to the tile; dV's store stops at
// head_dim_v, dK's and dQ's at head_dim.
#pragma once
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
    bwd_dkdv_kernel_16bit(const AttnBwdParams p,
                          const float* d_gmem,   // D_i (mask.h, query_row_index)
                          float* dq_accum_gmem,  // rows of dq_accum_cols, or nullptr: no dQ
                          int dq_accum_cols) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimV = Traits::kHeadDimV;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kVStride = Traits::kVSmemStride;
  constexpr int kPStride = Traits::kPSmemStride;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kSdpMTiles = Traits::kSdpKeys / kMmaM;       // 16-key m-tiles of S^T
  constexpr int kPassQueries = Traits::kSdpQueries / Traits::kSdpPasses;
  constexpr int kPassNTiles = kPassQueries / kMmaN;          // 8-query n-tiles of S^T
  constexpr int kPassKSteps = kPassQueries / kMmaK;          // of dV's k-steps (16 queries)
  constexpr int kOwnKSteps = Traits::kSdpQueries / kMmaK;
  constexpr int kQueryGroups = kBlockM / Traits::kSdpQueries;  // warps along S^T's queries
  constexpr int kDkvMTiles = Traits::kDkvKeys / kMmaM;
  constexpr int kDkNTiles = Traits::kDkCols / kMmaN;
  constexpr int kDvNTiles = Traits::kDvCols / kMmaN;
  constexpr int kDqMTiles = Traits::kDqRows / kMmaM;
  constexpr int kPassCols = Traits::kDqCols / Traits::kDqPasses;
  constexpr int kPassColTiles = kPassCols / kMmaN;

  if (!in_grid<TileAxis::kKeys>(p)) return;
  const auto work = work_tile<TileAxis::kKeys, kBlockN>(p);
  if (work.past_end()) return;
  const Sequence seq = work.seq;
  const int batch = work.batch, head_kv = work.head_kv, n_start = work.start;
  const bool want_dq = dq_accum_gmem != nullptr;

  FLASHATTN_DYNAMIC_SMEM(uint16_t, smem);
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);  // traits.h
  const SmemTile<kBlockN, kHeadDim, kStride> k_tile{shared.k};
  const SmemTile<kBlockN, kHeadDimV, kVStride> v_tile{shared.v};
  const SmemTile<kBlockM, kHeadDim, kStride> q_tile{shared.q};
  const SmemTile<kBlockM, kHeadDimV, kVStride> do_tile{shared.dout};
  const SmemTile<kBlockN, kBlockM, kPStride> pt_tile{shared.pt};   // P^T
  const SmemTile<kBlockN, kBlockM, kPStride> dst_tile{shared.dst};  // dS^T
  float* lse_smem = shared.lse;      // [kBlockM] LSE_i in log2 units
  float* dsum_smem = shared.dsum;    // [kBlockM] D_i

  const bool aligned =
      p.head_dim % kChunkElems == 0 && p.head_dim_v % kChunkElems == 0 &&
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
  // Q_i, dO_i by cp.async (one group; unrolled, as the forward's K/V: tile_io.cuh), LSE_i and
  // D_i by plain loads (a few floats; rows past Sq are masked).
  auto load_q_do = [&](int it) {
    const int head = head_of(it);
    const int m_start = m_start_of(it);
    const int rows_valid = seq.seqlen_q - m_start;
    const int64_t q_row = seq.q_row0 + m_start;
    load_tile_async<kNThreads, true>(
        q_tile, p.q.row<const uint16_t>(batch, head, q_row), p.q.row_stride, rows_valid,
        p.head_dim, aligned);
    load_tile_async<kNThreads, true>(
        do_tile, p.dout.row<const uint16_t>(batch, head, q_row), p.dout.row_stride, rows_valid,
        p.head_dim_v, aligned);
    ptx::cp_async_commit();
    const int64_t d_row0 = query_row_index(p, seq, head, m_start);
    // thread_index(): read here, not held across the main loop (tile_io.cuh, TileChunks); with
    // threadIdx.x the d = 128 kernel spilled 32 bytes on sm_90.
    for (int i = ptx::thread_index(); i < kBlockM; i += kNThreads) {
      const bool valid = i < rows_valid;
      FLASHATTN_SMEM(lse_smem)[i] =
          valid ? lse_shift_log2(*p.lse.row<const float>(batch, head, q_row + i)) : 0.f;
      FLASHATTN_SMEM(dsum_smem)[i] = valid ? d_gmem[d_row0 + i] : 0.f;
    }
  };

  // Prologue: Kj, Vj (one group) and the first query tile.
  const int keys_valid = seq.seqlen_k - n_start;
  load_tile_async<kNThreads>(
      k_tile, p.k.row<const uint16_t>(batch, head_kv, seq.k_row0 + n_start), p.k.row_stride,
      keys_valid, p.head_dim, aligned);
  load_tile_async<kNThreads>(
      v_tile, p.v.row<const uint16_t>(batch, head_kv, seq.k_row0 + n_start), p.v.row_stride,
      keys_valid, p.head_dim_v, aligned);
  ptx::cp_async_commit();
  if (iterations > 0) load_q_do(0);

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const WarpLanes lanes = WarpLanes::of(lane);
  // This warp's tiles of the three products (traits.h), as offsets into the CTA's tiles.
  const int sdp_key0 = (warp % Traits::kSdpWarpsN) * Traits::kSdpKeys;
  const int query_group = warp / Traits::kSdpWarpsN;
  const int sdp_query0 = query_group * Traits::kSdpQueries;
  const int dkv_key0 = (warp % Traits::kDkvWarpsN) * Traits::kDkvKeys;
  const int dk_col0 = (warp / Traits::kDkvWarpsN) * Traits::kDkCols;
  const int dv_col0 = (warp / Traits::kDkvWarpsN) * Traits::kDvCols;
  const int dq_row0 = (warp % Traits::kDqWarpsM) * Traits::kDqRows;
  const int dq_col0 = (warp / Traits::kDqWarpsM) * Traits::kDqCols;
  // This lane's entries of S^T (rows are keys, columns queries within Qi; acc_fragment.cuh),
  // and the keys of its rows: m-tile m, low (r = 0) or high row.
  const AccFragment st_frag = AccFragment::of(lanes, sdp_key0, 0);
  int key[kSdpMTiles][kRowsPerThread];
#pragma unroll
  for (int m = 0; m < kSdpMTiles; ++m) {
    st_frag.rows_of(m, key[m]);
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) key[m][r] += n_start;
  }
  const bool tail_keys = n_start + kBlockN > seq.seqlen_k;

  float dk_rmem[kDkvMTiles][kDkNTiles][4], dv_rmem[kDkvMTiles][kDvNTiles][4];
  zero_acc(dk_rmem);
  zero_acc(dv_rmem);

  for (int it = 0; it < iterations; ++it) {
    ptx::cp_async_wait<0>();
    // Tile `it` (and Kj, Vj) are in smem for every thread; every warp is done with dS^T of the
    // previous tile.
    __syncthreads();

    const int head = head_of(it);
    const int m_start = m_start_of(it);
    // attn_mask: a tile it hides is skipped (the whole CTA alike, so the barriers still match).
    const uint8_t mask_class = mask_tile(p.mask, batch, head, m_start,
                                         min(m_start + kBlockM, seq.seqlen_q), n_start,
                                         key_last + 1);
    if (mask_class == kMaskHidden) {
      if (it + 1 < iterations) load_q_do(it + 1);
      continue;
    }
    const ScoreRules rules = ScoreRules::make(p, seq, batch, head);

    // Only tiles some query of which misses some key (or that hang over Sq or Sk) pay for the
    // mask.
    const int m_last = m_start + kBlockM - 1;
    const ScoreTile score_tile{mask_class, tail_keys || m_last >= seq.seqlen_q ||
                                               first_visible_key(seq, m_last) > n_start ||
                                               visible_key_end(seq, m_start) < n_start + kBlockN};
    // This warp's S tile, in kSdpPasses slices of its queries.
#pragma unroll
    for (int pass = 0; pass < Traits::kSdpPasses; ++pass) {
      const int query0 = sdp_query0 + pass * kPassQueries;  // first query within Qi
      // P^T and dS^T of these queries as A fragments: the k-steps of dV += P^T dOi and
      // dK += dS^T Qi this warp can multiply before the others' columns are in smem.
      uint32_t own_p[kPassKSteps][kSdpMTiles][4], own_ds[kPassKSteps][kSdpMTiles][4];
      // S^T = Kj Qi^T and dP^T = Vj dOi^T.
      float s_rmem[kSdpMTiles][kPassNTiles][4], dp_rmem[kSdpMTiles][kPassNTiles][4];
      zero_acc(s_rmem);
      mma_ABt<Element>(s_rmem, k_tile.template rows<Traits::kSdpKeys>(sdp_key0),
                       q_tile.template rows<kPassQueries>(query0), lanes);
      zero_acc(dp_rmem);
      mma_ABt<Element>(dp_rmem, v_tile.template rows<Traits::kSdpKeys>(sdp_key0),
                       do_tile.template rows<kPassQueries>(query0), lanes);

      // Dropout's decisions, per m-tile: dV takes the dropped P, dS the dropped dP
      // (P * (dP * Z / (1 - p) - D)).
      uint32_t keep[kSdpMTiles];
#pragma unroll
      for (int m = 0; m < kSdpMTiles; ++m)
        keep[m] = rules.dropout_on() ? rules.keep_bits_by_key_rows<kPassNTiles>(
                                           key[m], m_start + query0, st_frag.col0)
                                     : 0u;
      // P^T and dS^T, element by element, into shared memory. Queries outer: a column's
      // LSE_i and D_i are read once for both m-tiles, then dead.
#pragma unroll
      for (int j = 0; j < kPassNTiles; ++j) {
        const int col0 = query0 + st_frag.col(j, 0);  // the lane's first query in Qi
        const float lse_log2[2] = {FLASHATTN_SMEM(lse_smem)[col0],
                                   FLASHATTN_SMEM(lse_smem)[col0 + 1]};
        const float dsum[2] = {FLASHATTN_SMEM(dsum_smem)[col0],
                               FLASHATTN_SMEM(dsum_smem)[col0 + 1]};
#pragma unroll
        for (int m = 0; m < kSdpMTiles; ++m) {
          float prob_pair[2], ds_pair[2];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int col = col0 + c % 2;  // query within Qi
            const int query = m_start + col;
            const int kv = key[m][c / 2];
            // Steps 1-6 and the chain rule (score_rules.cuh).
            const float kept = rules.kept(keep[m], AccFragment::bit(j, c));
            const ScoreGrad g = rules.backward<true, true>(s_rmem[m][j][c], dp_rmem[m][j][c], query,
                                                     kv, score_tile, lse_log2[c % 2],
                                                     dsum[c % 2], kept);
            if (p.dmask != nullptr && rules.in_sequence(query, kv))
              p.dmask[((static_cast<int64_t>(batch) * p.heads_q + head) * p.seqlen_q + query) *
                          p.seqlen_k + kv] = g.dlogit;
            prob_pair[c % 2] = g.prob * kept;
            ds_pair[c % 2] = g.dlogit * g.dlogit_ds;
            if (c % 2 == 1) {
              // The lane's two neighbouring queries of one key row: one 32-bit store each,
              // and word (j % 2) * 2 + c / 2 of k-step j / 2's A fragment (warp_tile.cuh,
              // acc_to_a_frag).
              const uint32_t p_word = pack_rn<Element>(prob_pair[0], prob_pair[1]);
              const uint32_t ds_word = pack_rn<Element>(ds_pair[0], ds_pair[1]);
              const int row = st_frag.row(m, c);
              *FLASHATTN_SMEM(reinterpret_cast<uint32_t*>(pt_tile.at(row, col0))) = p_word;
              *FLASHATTN_SMEM(reinterpret_cast<uint32_t*>(dst_tile.at(row, col0))) = ds_word;
              own_p[j / 2][m][(j % 2) * 2 + c / 2] = p_word;
              own_ds[j / 2][m][(j % 2) * 2 + c / 2] = ds_word;
            }
          }
        }
      }
      // dV_j += P^T dOi and dK_j += dS^T Qi over these queries, from registers: the warp's
      // dK/dV rows are its S tile's keys (traits.h).
      mma_regs_AB<Element>(dv_rmem, own_p, query0 / kMmaK,
                           do_tile.template cols<Traits::kDvCols>(dv_col0), lanes);
      mma_regs_AB<Element>(dk_rmem, own_ds, query0 / kMmaK,
                           q_tile.template cols<Traits::kDkCols>(dk_col0), lanes);
    }
    // P^T and dS^T are whole.
    __syncthreads();

    // The rest of dV_j += P^T dOi and dK_j += dS^T Qi: the other warps' queries, A (rows are
    // keys) from smem, B (the query tile) read with ldmatrix.trans.
    mma_smem_AB_except<Element, kQueryGroups, kOwnKSteps>(
        dv_rmem, query_group, pt_tile.template rows<Traits::kDkvKeys>(dkv_key0),
        do_tile.template cols<Traits::kDvCols>(dv_col0), lanes);
    mma_smem_AB_except<Element, kQueryGroups, kOwnKSteps>(
        dk_rmem, query_group, dst_tile.template rows<Traits::kDkvKeys>(dkv_key0),
        q_tile.template cols<Traits::kDkCols>(dk_col0), lanes);

    if (it + 1 < iterations) {
      // Every warp is done with Qi and dOi: the next tile's copy overlaps dQ.
      __syncthreads();
      load_q_do(it + 1);
    }

    if (want_dq) {
      // dQ_i += dS_ij Kj on this warp's dQ tile, in kDqPasses slices of its columns: dS from
      // dS^T's rows by ldmatrix.trans, Kj's rows are the k dimension.
      float* dq_accum = dq_accum_gmem + query_row_index(p, seq, head, 0) *
                                            dq_accum_cols;  // [Sq, dq_accum_cols]
#pragma unroll
      for (int pass = 0; pass < Traits::kDqPasses; ++pass) {
        const int col0 = dq_col0 + pass * kPassCols;
        float acc[kDqMTiles][kPassColTiles][4];
        zero_acc(acc);
        mma_smem<Element, kBlockN / kMmaK, BRows::kRowsAreK, ARows::kRowsAreK>(
            acc, dst_tile.template cols<Traits::kDqRows>(dq_row0),
            k_tile.template cols<kPassCols>(col0), lanes);
        // Each lane's two neighbouring columns go out as one 8-byte reduction: rows of the
        // accumulator are dq_accum_cols (even) floats and the scratch starts 8-byte aligned
        // (plan_bwd.h, dq_accum_offset). The pair's second column may be the tile's padding, which
        // nothing reads. Rows are queries of the sequence, columns dQ's (acc_fragment.cuh).
        const AccFragment dq_frag = AccFragment::of(lanes, m_start + dq_row0, col0);
#pragma unroll
        for (int m = 0; m < kDqMTiles; ++m)
#pragma unroll
          for (int t = 0; t < kPassColTiles; ++t)
#pragma unroll
            for (int h = 0; h < kRowsPerThread; ++h) {
              const int row = dq_frag.row(m, 2 * h), col = dq_frag.col(t, 0);
              if (row < seq.seqlen_q && col < p.head_dim)
                ptx::red_add_f32x2(dq_accum + static_cast<int64_t>(row) * dq_accum_cols + col,
                                   acc[m][t][2 * h], acc[m][t][2 * h + 1]);
            }
      }
    }
  }
  // Only empty groups can be pending here, unless no query sees this key tile and the loop
  // never ran, leaving Kj and Vj in flight.
  ptx::cp_async_wait_all();

  // Epilogue: dK_j, dV_j (already summed over the GQA group), this warp's rows and columns
  // (bwd_epilogue.cuh).
  const AccFragment dk_frag = AccFragment::of(lanes, n_start + dkv_key0, dk_col0);
  const AccFragment dv_frag = AccFragment::of(lanes, n_start + dkv_key0, dv_col0);
#pragma unroll
  for (int m = 0; m < kDkvMTiles; ++m) {
    int rows[kRowsPerThread];
    dk_frag.rows_of(m, rows);
    store_grad_rows<Element>(dk_rmem[m], rows, dk_frag.col0, seq.seqlen_k, p.head_dim,
                             GradRows::dk(p, seq, batch, head_kv), p.grads_fp32);
    store_grad_rows<Element>(dv_rmem[m], rows, dv_frag.col0, seq.seqlen_k, p.head_dim_v,
                             GradRows::dv(p, seq, batch, head_kv), p.grads_fp32);
  }
}

}  // namespace flashattn::cuda
