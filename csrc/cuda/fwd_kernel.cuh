// Forward attention for fp16/bf16 on tensor cores (FlashAttention-2, Algorithm 1).
//
// One CTA computes O_i for a tile Qi of kBlockM query rows of one (batch, head), or in a
// decoding step with GQA of the query heads of one kv head (gqa_decode.h, QueryRows). Qi stays in
// shared memory; the key/value tiles Kj, Vj it may see are streamed through one K and one V
// buffer, FA2's pipeline: V_j is copied while S_ij is computed, K_j+1 while O_i += P_ij Vj.
// Each of the kNWarps warps owns kMTiles x 16 query rows (warp_tile.cuh):
//   S_ij = Qi Kj^T        mma_ABt: ldmatrix (Q: A operand, K: B operand) -> mma.m16n8k16, fp32
//   P_ij = exp2(...)      online softmax in registers (softmax.cuh)
//   O_i += P_ij Vj        mma_AB_trans: P_ij re-packed from the S accumulator straight into A
//                         fragments, V through ldmatrix.trans as the B operand
// and O_i is divided by l_i once, at the end.
// A value head dim of its own (MLA, p.head_dim_v != p.head_dim) runs on a (kHeadDim, kHeadDimV)
// tile that covers both (plan_fwd.h, choose_kernels): its own where kernel_list.py lists one
// ((192, 128): V and O 128 wide), else the tile of the wider. Qi and Kj hold head_dim columns,
// Vj head_dim_v, each zero-filled to the tile, so the padding adds zeros to S and O, and O's
// store stops at head_dim_v. Only the one-m-tile kernel takes such pairs (plan_fwd.h,
// fwd_one_m_tile; v_cols below).
// MLA's 576 tile (traits.h) holds V and O 512 wide (kHeadDimV), and two warps share each m-tile,
// each computing the same S and its half of O's columns (kVColGroups).
#pragma once
#include <cstdint>

#include "../mask.h"
#include "../params.h"
#include "element.cuh"
#include "fwd_epilogue.cuh"
#include "gqa_decode.h"
#include "grid.h"
#include "key_source.cuh"
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
    fwd_kernel_16bit(const AttnParams p,
                     float* split_scratch /* num_splits > 1 or out_fp32: mask.h */) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimV = Traits::kHeadDimV;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kVStride = Traits::kVSmemStride;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kMTiles = Traits::kMTiles;      // 16-row m-tiles per warp
  constexpr int kNTilesN = kBlockN / kMmaN;     // 8-key n-tiles of S
  constexpr int kOCols = Traits::kOCols;        // O's columns of one warp
  constexpr int kNTilesD = kOCols / kMmaN;      // 8-column n-tiles of a warp's O

  // Split-KV: the grid's x holds num_splits CTAs per query block, each taking a part of its
  // key tiles.
  if (!in_grid<TileAxis::kQueries>(p)) return;
  const auto work = work_tile<TileAxis::kQueries, kBlockM, true>(p);
  if (work.past_end()) return;
  const Sequence seq = work.seq;
  const int batch = work.batch, head = work.head, head_kv = work.head_kv, m_start = work.start;
  // The CTA writes its fp32 part for split_merge_kernel: with splits, or (one split) when out
  // is float32 (params.h out_fp32), which the merge then writes unrounded.
  const bool writes_part = split_scratch != nullptr;
  // Which query token of which query head each row is: with packed GQA heads (gqa_decode.h), a
  // group's heads share the tile. Only the one-m-tile kernel is given them (plan_fwd.h).
  auto rows_from_params = [&] { return QueryRows{kMTiles == 1 ? p.packed_heads : 1, head}; };
  const QueryRows rows = rows_from_params();
  // Row r's query: a row of q, strided, last dim contiguous.
  auto q_row_of = [&](int row) {
    return p.q.row<const uint16_t>(batch, rows.q_head(row), seq.q_row0 + rows.token(row));
  };
  // V's and O's columns: head_dim_v, but head_dim in the two-m-tile kernel, which the plan gives
  // equal head dims only: with V's own count its d = 128 kernel, at 255 registers, spilled 180
  // bytes (sm_80).
  auto v_cols = [&] { return kMTiles == 1 ? p.head_dim_v : p.head_dim; };
  // One flag for the three tensors' copies (a ragged head dim of either is rare).
  const bool aligned =
      p.head_dim % kChunkElems == 0 && (kMTiles > 1 || p.head_dim_v % kChunkElems == 0) &&
      rows_are_16b_aligned(p.q) && rows_are_16b_aligned(p.k) && rows_are_16b_aligned(p.v);

  FLASHATTN_DYNAMIC_SMEM(uint16_t, smem);
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(smem);  // traits.h
  const SmemTile<kBlockM, kHeadDim, kStride> q_tile{shared.q};
  const SmemTile<kBlockN, kHeadDim, kStride> k_tile{shared.k};
  const SmemTile<kBlockN, kHeadDimV, kVStride> v_tile{shared.v};
  // Keys and values: rows of k / v from k_row0 on, or wherever a KV cache keeps them: pages of
  // a block table, another batch entry (key_source.cuh).
  const auto keys = KeySource<Traits>::make(p, seq, batch, head_kv, aligned, shared);

  const int m_last = min(m_start + kBlockM, seq.seqlen_q) - 1;
  KeyTiles<kBlockN> tiles = KeyTiles<kBlockN>::of(seq, rows.token(m_start), rows.token(m_last));
  split_part(tiles.begin, tiles.end, work.split(), work.splits);

  // Prologue: Qi and the first K tile, one cp.async group.
  if (rows.packed == 1) {
    load_tile_async<kNThreads>(q_tile, q_row_of(m_start), p.q.row_stride, seq.seqlen_q - m_start,
                               p.head_dim, aligned);
  } else {
    load_rows_async<kNThreads>(
        q_tile, [&](int r) { return q_row_of(m_start + r); }, q_row_of(m_start),
        seq.seqlen_q - m_start, p.head_dim, aligned);
  }
  if (tiles.begin < tiles.end) {
    if (keys.paged_table) {  // the first tile's rows; later tiles' are looked up in the loop
      keys.look_up(tiles.begin);
      __syncthreads();
    }
    keys.load_keys(k_tile, tiles.begin, p.head_dim);
  }

  const int warp = threadIdx.x / kWarpSize;
  const WarpLanes lanes = WarpLanes::of(threadIdx.x % kWarpSize);
  // first of this warp's rows within Qi, and of its O columns (kVColGroups warps share the rows)
  const int warp_row0 = (warp % Traits::kRowWarps) * kMTiles * kMmaM;
  const int warp_col0 = (warp / Traits::kRowWarps) * kOCols;
  // S_ij's rows: this warp's (acc_fragment.cuh). Built once, here: built per tile in the loop,
  // it left the tile-mask test's key bounds (KeyTiles) recomputed per tile from inputs that then
  // stayed live across the loop, and the d = 96 kernel spilled on sm_90.
  const AccFragment s_frag = AccFragment::of(lanes, m_start + warp_row0, 0);
  const ScoreRules rules = ScoreRules::make(p, seq, batch, head);
  RowStats stats[kMTiles];
  float o_rmem[kMTiles][kNTilesD][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) stats[m].init();
  zero_acc(o_rmem);

  for (int tile = tiles.begin; tile < tiles.end; ++tile) {
    ptx::cp_async_wait_all();
    // Kj (and Qi) are in smem for every thread, and every warp is done with V_j-1.
    __syncthreads();
    const int n_start = tile * kBlockN;
    // attn_mask: a tile it hides is skipped (uniform over the CTA, so the barriers match); one
    // it leaves open takes the unmasked path.
    const uint8_t mask_class = mask_tile(p.mask, batch, head, m_start, m_last + 1, n_start,
                                         min(n_start + kBlockN, seq.seqlen_k));
    const bool visible = mask_class != kMaskHidden;
    if (visible) keys.load_values(v_tile, tile, v_cols());
    // In the one-m-tile kernel, which runs decoding steps (a few rows of a 64-row tile: plan_fwd.h
    // kFwdFewRows, gqa_decode.h), a warp whose rows all lie past the sequence takes part in the
    // copies and barriers only: its products would be thrown away. The two-m-tile kernel meets such
    // warps only in a sequence's last query block, and the test made it spill at d = 128.
    const bool computes = visible && (kMTiles > 1 || m_start + warp_row0 < seq.seqlen_q);

    float s_rmem[kMTiles][kNTilesN][4];
    if (computes) {
      // Dropout's decisions for this tile, drawn before the S accumulator is live.
      // Read where used, not held across the loop: registers are the two-m-tile kernel's limit.
      auto drops = [&] { return Traits::kDropout && rules.dropout_on(); };
      uint32_t keep[kMTiles];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        int rows[kRowsPerThread];
        s_frag.rows_of(m, rows);
        keep[m] = drops() ? rules.keep_bits_by_query_rows<kNTilesN>(rows, n_start, lanes.acc_col)
                        : 0u;
      }
      // S_ij = Qi Kj^T for this warp's rows.
      zero_acc(s_rmem);
      mma_ABt<Element>(s_rmem, q_tile.template rows<kMTiles * kMmaM>(warp_row0), k_tile, lanes);

      const ScoreTile score_tile{mask_class, tiles.needs_mask(tile)};
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        // Steps 1-5 (score_rules.cuh) written out, not rules.apply: through a call the compiler
        // turns each entry's visibility branch into selects, and the d = 128 two-m-tile kernel
        // spills (docs/lab/2026-12-03-issue-30-leftovers.md). Visibility goes by the row's query
        // token: the row unless heads are packed, the mapping rebuilt from p per entry (`rows`,
        // kept in registers across the loop, spilled the d = 256 kernel).
        // One test per m-tile, uniform over the CTA: with raw scores (keep_raw, per launch) in a
        // tile that hides no key, steps 1-5 are the identity, so such a tile runs no per-entry
        // test at all (tested per entry, they were most of the unmasked step's non-mma work).
        // One test around all m-tiles made the d = 128 two-m-tile kernel spill.
        if (!rules.keep_raw || score_tile.needs_mask)
#pragma unroll
        for (int j = 0; j < kNTilesN; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            // Written out, not n_start + s_frag.col(j, c): that sum spilled the d = 128 kernel.
            const int key = n_start + j * kMmaN + lanes.acc_col + c % 2;
            const int q_row = s_frag.row(m, c);
            float x = s_rmem[m][j][c];
            if (!rules.keep_raw) {
              x = rules.logit(x, q_row, key);
              if (rules.reads_mask(score_tile, q_row, key)) x += rules.mask_bias_at(q_row, key);
            }
            if (score_tile.needs_mask &&
                !key_visible(rules.seq, rows_from_params().token(q_row), key))
              x = -INFINITY;
            s_rmem[m][j][c] = x;
          }
        stats[m].update(s_rmem[m], o_rmem[m], rules.to_log2);
        // P_ij becomes P_ij * Z_ij / (1 - p) for the product with V only: l_i above is over all
        // of P_ij.
        if (drops()) rules.drop(s_frag, m, s_rmem[m], keep[m]);
      }
    }

    // The next tile's rows, into the table's other buffer (paged_row_table.cuh): the barrier
    // below orders them before its K copy.
    if (keys.paged_table && tile + 1 < tiles.end) keys.look_up(tile + 1);
    ptx::cp_async_wait_all();
    // Vj is in smem for every thread, and every warp is done with Kj.
    __syncthreads();
    if (tile + 1 < tiles.end) keys.load_keys(k_tile, tile + 1, p.head_dim);
    // O_i += P_ij Vj, over this warp's columns of Vj.
    if (computes)
      mma_AB_trans<Element>(o_rmem, s_rmem, v_tile.template cols<kOCols>(warp_col0), lanes);
  }
  // Nothing is in flight here, unless the CTA saw no key tile at all and skipped the loop,
  // leaving Qi's copy pending.
  ptx::cp_async_wait_all();

  // Epilogue: O_i / l_i, and LSE_i, to the rows fwd_epilogue.cuh names. Without a part to
  // write, O_i goes out through shared memory (Qi's tile, free once every warp is past the loop)
  // so that each thread stores 16 bytes at a time: stored from the accumulator, a warp's 4-byte
  // stores fill half of each 32-byte sector.
  const FwdRowOutputs outputs =
      FwdRowOutputs::make(p, split_scratch, writes_part, work.split(), batch, seq, rows);
  const SmemTile<kBlockM, kHeadDimV, kStride> o_tile{shared.q};  // O_i, in Qi's place
  if (!writes_part) __syncthreads();
  // O's entries: this warp's rows and columns.
  const AccFragment o_frag = AccFragment::of(lanes, m_start + warp_row0, warp_col0);
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    int row[kRowsPerThread];
    o_frag.rows_of(m, row);
    float inv_l[kRowsPerThread], lse[kRowsPerThread];
    stats[m].finalize(rules.to_log2, inv_l, lse);
    if (writes_part) {  // this split's part, in fp32, for split_merge_kernel
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        if (row[r] >= seq.seqlen_q) continue;
        float* out = outputs.part_row(row[r]);
#pragma unroll
        for (int d = 0; d < kNTilesD; ++d)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = o_frag.col(d, e);
            if (col < v_cols()) out[col] = o_rmem[m][d][2 * r + e] * inv_l[r];
          }
        if (lanes.acc_col == 0 && warp_col0 == 0) *outputs.lse_of(row[r]) = lse[r];
      }
      continue;
    }
    accumulator_to_smem<Element>(o_rmem[m], inv_l, lanes.acc_row, lanes.acc_col,
                                 o_tile.template part<kMmaM, kOCols>(warp_row0 + m * kMmaM,
                                                                     warp_col0));
    if (lanes.acc_col == 0 && warp_col0 == 0) {
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
        if (row[r] < seq.seqlen_q) *outputs.lse_of(row[r]) = lse[r];
    }
  }
  if (writes_part) return;
  __syncthreads();
  const bool out_aligned = v_cols() % kChunkElems == 0 && rows_are_16b_aligned(p.o);
  const int rows_valid = seq.seqlen_q - m_start;
  if (rows.packed == 1) {
    uint16_t* o_gmem = outputs.out_row<uint16_t>(m_start);
    store_rows<kNThreads>(
        o_tile, [&](int r) { return o_gmem + r * p.o.row_stride; }, rows_valid, v_cols(),
        out_aligned);
  } else {
    store_rows<kNThreads>(
        o_tile, [&](int r) { return outputs.out_row<uint16_t>(m_start + r); }, rows_valid,
        v_cols(), out_aligned);
  }
}

}  // namespace flashattn::cuda
