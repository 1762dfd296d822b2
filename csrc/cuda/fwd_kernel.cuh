// Forward attention for fp16/bf16 on tensor cores (FlashAttention-2, Algorithm 1).
//
// One CTA computes O_i for a tile Qi of kBlockM query rows of one (batch, head). Qi stays in
// shared memory; the key/value tiles Kj, Vj it may see are streamed through a kStages-deep
// cp.async ring. Each of the kNWarps warps owns 16 query rows:
//   S_ij = Qi Kj^T        ldmatrix (Q: A operand, K: B operand) -> mma.m16n8k16, fp32
//   P_ij = exp2(...)      online softmax in registers (softmax.cuh)
//   O_i += P_ij Vj        P_ij re-packed from the S accumulator straight into A fragments,
//                         V through ldmatrix.trans as the B operand
// and O_i is divided by l_i once, at the end.
#pragma once
#include <cstdint>

#include "../dropout.h"
#include "../kv_rows.h"
#include "dropout_bits.cuh"
#include "../mask.h"
#include "../params.h"
#include "element.cuh"
#include "grid.h"
#include "logit.cuh"
#include "ptx.cuh"
#include "softmax.cuh"
#include "tile_io.cuh"
#include "traits.h"

namespace flashattn::cuda {

template <typename Traits, typename Element>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    fwd_kernel_16bit(const AttnParams p, float* split_scratch /* num_splits > 1: mask.h */) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kStages = Traits::kStages;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kNTilesN = kBlockN / kMmaN;     // 8-key n-tiles of S
  constexpr int kNTilesD = kHeadDim / kMmaN;    // 8-column n-tiles of O
  constexpr int kKStepsD = kHeadDim / kMmaK;    // k-steps of Qi Kj^T
  constexpr int kKStepsN = kBlockN / kMmaK;     // k-steps of P_ij Vj

  const int64_t batch_head = folded_batch_head();
  if (batch_head >= static_cast<int64_t>(p.batch) * p.heads_q) return;
  const int batch = static_cast<int>(batch_head / p.heads_q);
  const int head = static_cast<int>(batch_head % p.heads_q);
  const int head_kv = head / p.head_group;
  // Split-KV: the grid's x holds num_splits CTAs per query block, each taking a part of its
  // key tiles.
  const int splits = p.num_splits > 1 ? p.num_splits : 1;
  const int split = static_cast<int>(blockIdx.x % splits);
  const int m_start = static_cast<int>(blockIdx.x / splits) * kBlockM;
  // The grid covers the longest sequence; CTAs past this one's end have nothing to do.
  const Sequence seq = sequence_of(p, batch);
  if (m_start >= seq.seqlen_q) return;

  // [Sq, D] / [Sk, D] views of this (batch, head); rows strided, last dim contiguous.
  const uint16_t* q_gmem = p.q.row<const uint16_t>(batch, head, seq.q_row0 + m_start);
  // Keys and values: rows of k / v from k_row0 on, or wherever a KV cache keeps them
  // (kv_rows.h: pages of a block table, another batch entry).
  const bool keys_in_rows = keys_in_place(p.kv_cache);
  const uint16_t* k_gmem = p.k.row<const uint16_t>(keys_in_rows ? batch : 0, head_kv,
                                                   keys_in_rows ? seq.k_row0 : 0);
  const uint16_t* v_gmem = p.v.row<const uint16_t>(keys_in_rows ? batch : 0, head_kv,
                                                   keys_in_rows ? seq.k_row0 : 0);

  const bool aligned =
      p.head_dim % kChunkElems == 0 &&
      rows_are_16b_aligned(p.q) && rows_are_16b_aligned(p.k) && rows_are_16b_aligned(p.v);

  FLASHATTN_DYNAMIC_SMEM(uint16_t, smem);
  uint16_t* q_smem = smem;                                  // [kBlockM, kStride]
  uint16_t* kv_smem = smem + Traits::kQSmemElems;           // kStages x ([kBlockN, kStride] K, V)
  auto k_smem = [&](int stage) { return kv_smem + (2 * stage) * Traits::kKVTileSmemElems; };
  auto v_smem = [&](int stage) { return kv_smem + (2 * stage + 1) * Traits::kKVTileSmemElems; };

  // Key tiles this CTA needs: first_visible_key and visible_key_end never decrease with the
  // row, so the union over the CTA's rows is [first(m_start), end(m_last)).
  const int m_last = min(m_start + kBlockM, seq.seqlen_q) - 1;
  const int key_begin = first_visible_key(seq, m_start);
  const int key_end = visible_key_end(seq, m_last);
  int tile_begin = key_begin / kBlockN;
  int tile_end = key_end > key_begin ? (key_end + kBlockN - 1) / kBlockN : tile_begin;
  split_part(tile_begin, tile_end, split, splits);
  // A tile whose keys every row of the CTA sees needs no per-element mask.
  const int unmasked_from = first_visible_key(seq, m_last);
  const int unmasked_to = visible_key_end(seq, m_start);

  auto cache_row = [&](TensorView view, int key) {
    return key_row<const uint16_t>(view, p.kv_cache, seq, head_kv, key);
  };
  auto load_kv = [&](int tile) {
    const int stage = (tile - tile_begin) % kStages;
    const int n_start = tile * kBlockN;
    const int rows_valid = seq.seqlen_k - n_start;
    if (keys_in_rows) {
      load_tile_async<kBlockN, kHeadDim, kStride, kNThreads>(
          k_smem(stage), k_gmem + n_start * p.k.row_stride, p.k.row_stride, rows_valid,
          p.head_dim, aligned);
      load_tile_async<kBlockN, kHeadDim, kStride, kNThreads>(
          v_smem(stage), v_gmem + n_start * p.v.row_stride, p.v.row_stride, rows_valid,
          p.head_dim, aligned);
    } else {
      load_rows_async<kBlockN, kHeadDim, kStride, kNThreads>(
          k_smem(stage), [&](int r) { return cache_row(p.k, n_start + r); }, k_gmem, rows_valid,
          p.head_dim, aligned);
      load_rows_async<kBlockN, kHeadDim, kStride, kNThreads>(
          v_smem(stage), [&](int r) { return cache_row(p.v, n_start + r); }, v_gmem, rows_valid,
          p.head_dim, aligned);
    }
  };

  // Prologue: Qi and the first kStages - 1 key tiles, one cp.async group per tile.
  load_tile_async<kBlockM, kHeadDim, kStride, kNThreads>(
      q_smem, q_gmem, p.q.row_stride, seq.seqlen_q - m_start, p.head_dim, aligned);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (tile_begin + s < tile_end) load_kv(tile_begin + s);
    ptx::cp_async_commit();
  }

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int warp_row0 = warp * kMmaM;  // first of this warp's 16 rows within Qi
  // This lane's two rows (lane/4 and lane/4 + 8 of the warp's 16), as global row indices.
  int row[kRowsPerThread];
  int row_first_key[kRowsPerThread], row_key_end[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    row[r] = m_start + warp_row0 + lane / 4 + r * kRowOffsetHi;
    row_first_key[r] = first_visible_key(seq, row[r]);
    row_key_end[r] = visible_key_end(seq, row[r]);
  }
  const int lane_col = 2 * (lane % 4);  // first of this lane's 2 columns in an n-tile

  // ldmatrix row addresses, each lane supplying one row of one 8x8 matrix:
  // A (Qi, 16x16 at k): lanes 0-15 rows 0-15 at column k, lanes 16-31 rows 0-15 at k + 8.
  const int a_row = lane % 16, a_col = (lane / 16) * 8;
  // B (Kj, two 8-key n-tiles x 16 dims): matrices (keys 0-7, k), (0-7, k+8), (8-15, k),
  // (8-15, k+8) -> registers b0, b1 of n-tile 2t and b0, b1 of n-tile 2t+1.
  const int b_row = lane % 8 + (lane / 16) * 8, b_col = ((lane / 8) % 2) * 8;
  // B (Vj, trans, 16 keys x two 8-column n-tiles): same lane pattern as A.

  const LogitRules rules = LogitRules::make(p, seq, batch, head);
  RowStats stats;
  stats.init();
  float o_rmem[kNTilesD][4];
#pragma unroll
  for (int d = 0; d < kNTilesD; ++d)
#pragma unroll
    for (int c = 0; c < 4; ++c) o_rmem[d][c] = 0.f;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    ptx::cp_async_wait<kStages - 2>();
    // Tile `tile` (and Qi) are now in smem for every thread, and every warp has finished
    // reading the stage the next copy overwrites.
    __syncthreads();
    if (tile + kStages - 1 < tile_end) load_kv(tile + kStages - 1);
    ptx::cp_async_commit();

    const int n_start = tile * kBlockN;
    // attn_mask: a tile it hides is skipped; one it leaves open takes the unmasked path.
    const uint8_t mask_class = mask_tile(p.mask, batch, head, m_start, m_last + 1, n_start,
                                         min(n_start + kBlockN, seq.seqlen_k));
    if (mask_class == kMaskHidden) continue;
    const int stage = (tile - tile_begin) % kStages;
    const uint16_t* kj_smem = k_smem(stage);
    const uint16_t* vj_smem = v_smem(stage);

    // Dropout's decisions for this tile, drawn before the S accumulator is live.
    const uint32_t keep = p.dropout.on() ? keep_bits_by_query_rows<kNTilesN>(
                                               p.dropout, batch, head, row, n_start,
                                               lane_col)
                                         : 0u;
    // S_ij = Qi Kj^T for this warp's 16 rows.
    float s_rmem[kNTilesN][4];
#pragma unroll
    for (int j = 0; j < kNTilesN; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) s_rmem[j][c] = 0.f;
#pragma unroll
    for (int k = 0; k < kKStepsD; ++k) {
      uint32_t a[4];
      ptx::ldmatrix_x4(a[0], a[1], a[2], a[3],
                       q_smem + (warp_row0 + a_row) * kStride + k * kMmaK + a_col);
#pragma unroll
      for (int j = 0; j < kNTilesN; j += 2) {
        uint32_t b[2][2];
        ptx::ldmatrix_x4(b[0][0], b[0][1], b[1][0], b[1][1],
                         kj_smem + (j * kMmaN + b_row) * kStride + k * kMmaK + b_col);
        mma_16816<Element>(s_rmem[j], a, b[0]);
        mma_16816<Element>(s_rmem[j + 1], a, b[1]);
      }
    }

    if (!rules.keep_raw) {
#pragma unroll
      for (int j = 0; j < kNTilesN; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int key = n_start + j * kMmaN + lane_col + c % 2;
          const int r = c / 2;
          float x = rules.logit(s_rmem[j][c], row[r], key);
          if (mask_class == kMaskRead && row[r] < seq.seqlen_q && key < seq.seqlen_k)
            x += mask_bias(p.mask, batch, head, row[r], key);
          s_rmem[j][c] = x;
        }
    }
    const bool needs_mask = n_start < unmasked_from || n_start + kBlockN > unmasked_to;
    if (needs_mask) {
#pragma unroll
      for (int j = 0; j < kNTilesN; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int key = n_start + j * kMmaN + lane_col + c % 2;
          const int r = c / 2;
          if (key < row_first_key[r] || key >= row_key_end[r]) s_rmem[j][c] = -INFINITY;
        }
    }

    stats.update(s_rmem, o_rmem, rules.to_log2);
    if (p.dropout.on()) {
      // P_ij becomes P_ij * Z_ij / (1 - p) for the product with V only: l_i above is over all
      // of P_ij.
#pragma unroll
      for (int j = 0; j < kNTilesN; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) s_rmem[j][c] *= kept_factor(p.dropout, keep, 4 * j + c);
    }

    // O_i += P_ij Vj. The S accumulator of n-tiles (2k, 2k+1) is exactly the A fragment of
    // k-step k: a0/a1 = rows lo/hi of keys 0-7, a2/a3 = rows lo/hi of keys 8-15.
#pragma unroll
    for (int k = 0; k < kKStepsN; ++k) {
      const uint32_t a[4] = {pack_rn<Element>(s_rmem[2 * k][0], s_rmem[2 * k][1]),
                             pack_rn<Element>(s_rmem[2 * k][2], s_rmem[2 * k][3]),
                             pack_rn<Element>(s_rmem[2 * k + 1][0], s_rmem[2 * k + 1][1]),
                             pack_rn<Element>(s_rmem[2 * k + 1][2], s_rmem[2 * k + 1][3])};
#pragma unroll
      for (int d = 0; d < kNTilesD; d += 2) {
        uint32_t b[2][2];
        ptx::ldmatrix_x4_trans(b[0][0], b[0][1], b[1][0], b[1][1],
                               vj_smem + (k * kMmaK + a_row) * kStride + d * kMmaN + a_col);
        mma_16816<Element>(o_rmem[d], a, b[0]);
        mma_16816<Element>(o_rmem[d + 1], a, b[1]);
      }
    }
  }
  // Only empty groups can be pending here, unless the CTA saw no key tile at all and skipped
  // the loop, leaving Qi's copy in flight.
  ptx::cp_async_wait_all();

  // Epilogue: O_i / l_i, and LSE_i.
  float inv_l[kRowsPerThread], lse[kRowsPerThread];
  stats.finalize(rules.to_log2, inv_l, lse);
  if (splits > 1) {  // this split's part, in fp32, for split_merge_kernel
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      if (row[r] >= seq.seqlen_q) continue;
      float* out = split_out_row(p, split_scratch, split, batch, head, seq.q_row0 + row[r]);
#pragma unroll
      for (int d = 0; d < kNTilesD; ++d)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = d * kMmaN + lane_col + e;
          if (col < p.head_dim) out[col] = o_rmem[d][2 * r + e] * inv_l[r];
        }
      if (lane % 4 == 0)
        *split_lse_of(p, split_scratch, split, batch, head, seq.q_row0 + row[r]) = lse[r];
    }
    return;
  }
  store_accumulator_rows<Element, kNTilesD>(o_rmem, row, inv_l, seq.seqlen_q, p.head_dim,
                                            lane_col, p.o, batch, head, seq.q_row0);
  if (lane % 4 == 0) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
      if (row[r] < seq.seqlen_q) *p.lse.row<float>(batch, head, seq.q_row0 + row[r]) = lse[r];
  }
}

}  // namespace flashattn::cuda
