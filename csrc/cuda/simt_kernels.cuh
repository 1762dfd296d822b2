// fp32 attention on CUDA cores (no tensor cores take fp32 without rounding it to tf32, and
// fp32 callers ask for accuracy). Same algorithm as the 16-bit kernels, in a SIMT layout:
//   simt_fwd_kernel   warp = query row i; lane = key j of a 32-key tile for S_ij and P_ij,
//                     lane = columns {lane, lane + 32, ...} for O_i (P_ij broadcast by shuffle)
//   simt_dq_kernel    the same shape: dQ_i += dS_ij Kj
//   simt_dkdv_kernel  warp = key row j (all query heads of its GQA group); lane = query i of a
//                     32-query tile: dV_j += P_ij dO_i, dK_j += dS_ij Q_i
// Every tile is staged in smem with rows of kHeadDim + 1 floats: lane-strided row reads then
// fall into 32 different banks. A value head dim of its own (MLA) runs on the tile of the wider
// (plan_fwd.h, tile_head_dim): Q, K over head_dim columns, V, dO over head_dim_v, zero-filled to
// the tile; O and dV are stored over head_dim_v, dQ and dK over head_dim.
#pragma once
#include <cstdint>

#include "../mask.h"
#include "../params.h"
#include "bwd_epilogue.cuh"
#include "fwd_epilogue.cuh"
#include "gqa_decode.h"
#include "key_source.cuh"
#include "grid.h"
#include "mask_range.cuh"
#include "ptx.cuh"
#include "score_rules.cuh"
#include "smem_tile.cuh"
#include "softmax.cuh"
#include "tile_io.cuh"
#include "tile_scheduler.cuh"
#include "traits.h"

namespace flashattn::cuda {

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, offset));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(kFullWarpMask, x, offset);
  return x;
}

// Dot product of two smem rows of kHeadDim floats, in four interleaved partial sums added pairwise:
// one chain of kHeadDim fmaf rounds each step at the whole sum's size, and the backward's
// dS = P (dP - D) of a row that sees one key is that rounding (D is a warp tree sum): four chains
// cut dK's error there by 30% (docs/lab/2026-12-04-simt-summation.md), and give the FMA pipe
// four independent chains.
template <int kHeadDim>
__device__ __forceinline__ float dot_row(const float* a, const float* b) {
  constexpr int kChains = 4;
  static_assert(kHeadDim % kChains == 0, "head-dim tiles are multiples of 32");
  float sum[kChains] = {};
#pragma unroll 2
  for (int c = 0; c < kHeadDim; c += kChains) {
#pragma unroll
    for (int k = 0; k < kChains; ++k)
      sum[k] = fmaf(FLASHATTN_SMEM(a)[c + k], FLASHATTN_SMEM(b)[c + k], sum[k]);
  }
  return (sum[0] + sum[1]) + (sum[2] + sum[3]);
}

// acc[t] += sum over lanes j of coef_j * rows[j][lane + 32 t]  (coef_j is lane j's coef).
// The tile's 32 products are summed on their own and then added to acc (blocked summation), as
// a tensor-core tile's would be: added straight into a long running sum, each rounds at the
// sum's magnitude, and dV of a key seen by 127 queries erred 5x more than PyTorch's GEMM.
template <int kColsPerLane, typename Tile>
__device__ __forceinline__ void accumulate_rows(float (&acc)[kColsPerLane], float coef,
                                                const Tile& rows, int lane) {
  static_assert(Tile::kRows == kWarpSize, "a row per lane");
  float tile_sum[kColsPerLane] = {};
  for (int j = 0; j < kWarpSize; ++j) {
    const float coef_j = __shfl_sync(kFullWarpMask, coef, j);
#pragma unroll
    for (int t = 0; t < kColsPerLane; ++t)
      tile_sum[t] =
          fmaf(coef_j, FLASHATTN_SMEM(rows.at(j, lane + t * kWarpSize))[0], tile_sum[t]);
  }
#pragma unroll
  for (int t = 0; t < kColsPerLane; ++t) acc[t] += tile_sum[t];
}

// One CTA per SM is all the launch bounds promise, so ptxas may use up to 255 registers: with
// the default it capped these kernels near 64 and spilled (sm_90, d = 128 and 256).
constexpr int kSimtMinBlocksPerSm = 1;

// The CTA's query rows [m_start, m_start + kNWarps) and the 32-key tiles they see; `rows`
// gives the rows' positions (packed GQA heads, gqa_decode.h).
struct SimtRowBlock {
  int m_start, m_end;
  int tile_begin, tile_end;
  __device__ __forceinline__ SimtRowBlock(const Sequence& seq, const QueryRows& rows,
                                          int m_start_, int block_rows)
      : m_start(m_start_), m_end(min(m_start_ + block_rows, seq.seqlen_q)) {
    const int key_begin = first_visible_key(seq, rows.token(m_start));
    const int key_end = visible_key_end(seq, rows.token(m_end - 1));
    tile_begin = key_begin / kWarpSize;
    tile_end = key_end > key_begin ? (key_end + kWarpSize - 1) / kWarpSize : tile_begin;
  }

  // attn_mask's class of the block's rows and the 32 keys from n_start.
  __device__ __forceinline__ uint8_t attn_mask(const AttnParams& p, const Sequence& seq,
                                               int batch, int head, int n_start) const {
    return mask_tile(p.mask, batch, head, m_start, m_end, n_start,
                     min(n_start + kWarpSize, seq.seqlen_k));
  }
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, kSimtMinBlocksPerSm) simt_fwd_kernel(
    const AttnParams p, float* split_scratch /* num_splits > 1: mask.h */) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kCols = Traits::kColsPerLane;
  // Split-KV: num_splits CTAs per row block, each taking a part of its key tiles.
  if (!in_grid<TileAxis::kQueries>(p)) return;
  const auto work = work_tile<TileAxis::kQueries, Traits::kNWarps, true>(p);
  if (work.past_end()) return;
  const Sequence seq = work.seq;
  const int batch = work.batch, head = work.head, head_kv = work.head_kv, m_start = work.start;
  const int splits = work.splits, split = work.split();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row = m_start + warp;
  // Which query token of which query head each row is (packed GQA heads, gqa_decode.h).
  const QueryRows rows{p.packed_heads, head};
  const QueryPlace place = rows.at(row);  // this warp's row

  FLASHATTN_DYNAMIC_SMEM(float, smem);
  auto& shared = *reinterpret_cast<typename Traits::QueryRowsStorage*>(smem);  // traits.h
  const SmemTile<Traits::kNWarps, kHeadDim, kStride, float> q_tile{shared.q};  // a row per warp
  const SmemTile<kWarpSize, kHeadDim, kStride, float> k_tile{shared.k};        // a key per lane
  const SmemTile<kWarpSize, kHeadDim, kStride, float> v_tile{shared.v};
  // Keys and values: rows of k / v, or wherever a KV cache keeps them (key_source.cuh).
  const auto keys = SimtKeySource<Traits>::make(p, seq, head_kv);
  load_rows_f32<Traits::kNThreads>(
      q_tile,
      [&](int r) {
        const int q_row = m_start + r;
        return p.q.row<const float>(batch, rows.q_head(q_row), seq.q_row0 + rows.token(q_row));
      },
      seq.seqlen_q - m_start, p.head_dim);

  const ScoreRules rules = ScoreRules::make(p, seq, batch, head);
  const SimtRowBlock block(seq, rows, m_start, Traits::kNWarps);
  int tile_begin = block.tile_begin, tile_end = block.tile_end;
  split_part(tile_begin, tile_end, split, splits);
  const DropoutSeed dropout = dropout_seed(p.dropout);
  float m_i = -INFINITY, l_i = 0.f;  // log2 units
  float o[kCols] = {};
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int n_start = tile * kWarpSize;
    const uint8_t mask_class = block.attn_mask(p, seq, batch, head, n_start);
    if (mask_class == kMaskHidden) continue;  // the whole CTA alike
    __syncthreads();  // every warp is done with the previous tile
    keys.load_keys(k_tile, tile, p.head_dim);
    keys.load_values(v_tile, tile, p.head_dim_v);
    __syncthreads();
    const int key = n_start + lane;
    const float s = dot_row<kHeadDim>(q_tile.at(warp, 0), k_tile.at(lane, 0));
    // Steps 1-5 (score_rules.cuh); every SIMT tile takes the per-entry mask. Rows past the
    // sequence are never stored.
    const float x = rules.forward_log2(s, row, place.token, key, ScoreTile{mask_class, true});
    const float m_new = fmaxf(m_i, warp_max(x));
    const float base = m_new == -INFINITY ? 0.f : m_new;  // no -inf - -inf for empty rows
    const float correction = exp2f(m_i - base);
    const float prob = exp2f(x - base);
    l_i = l_i * correction + warp_sum(prob);
    m_i = m_new;
#pragma unroll
    for (int t = 0; t < kCols; ++t) o[t] *= correction;
    // Dropout drops from the product with V only: l_i above summed the whole P_ij.
    accumulate_rows<kCols>(o, prob * rules.kept(dropout, row, key), v_tile, lane);
  }
  if (row >= seq.seqlen_q) return;
  // [D]: the output row, or this split's part of it (fwd_epilogue.cuh).
  const FwdRowOutputs outputs =
      FwdRowOutputs::make(p, split_scratch, splits > 1, split, batch, seq, rows);
  float inv_l, lse;
  finish_row(m_i, l_i, inv_l, lse);
  float* o_row = outputs.f32_row(place);
  float* lse_row = outputs.lse_of(place);
#pragma unroll
  for (int t = 0; t < kCols; ++t)
    if (lane + t * kWarpSize < p.head_dim_v) o_row[lane + t * kWarpSize] = o[t] * inv_l;
  if (lane == 0) *lse_row = lse;
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, kSimtMinBlocksPerSm)
    simt_dq_kernel(const AttnBwdParams p, const float* d_gmem /* D_i, by query_row_index */) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kCols = Traits::kColsPerLane;
  if (!in_grid<TileAxis::kQueries>(p)) return;
  const auto work = work_tile<TileAxis::kQueries, Traits::kNWarps>(p);
  if (work.past_end()) return;
  const Sequence seq = work.seq;
  const int batch = work.batch, head = work.head, head_kv = work.head_kv, m_start = work.start;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row = m_start + warp;

  FLASHATTN_DYNAMIC_SMEM(float, smem);
  auto& shared = *reinterpret_cast<typename Traits::QueryRowsStorage*>(smem);  // traits.h
  const SmemTile<Traits::kNWarps, kHeadDim, kStride, float> q_tile{shared.q};  // a row per warp
  const SmemTile<Traits::kNWarps, kHeadDim, kStride, float> do_tile{shared.dout};
  const SmemTile<kWarpSize, kHeadDim, kStride, float> k_tile{shared.k};  // a key per lane
  const SmemTile<kWarpSize, kHeadDim, kStride, float> v_tile{shared.v};
  const float* k_gmem = p.k.row<const float>(batch, head_kv, seq.k_row0);
  const float* v_gmem = p.v.row<const float>(batch, head_kv, seq.k_row0);
  const int64_t q_row0 = seq.q_row0 + m_start;
  load_rows_f32<Traits::kNThreads>(
      q_tile, p.q.row<const float>(batch, head, q_row0), p.q.row_stride, seq.seqlen_q - m_start,
      p.head_dim);
  load_rows_f32<Traits::kNThreads>(
      do_tile, p.dout.row<const float>(batch, head, q_row0), p.dout.row_stride,
      seq.seqlen_q - m_start, p.head_dim_v);

  const ScoreRules rules = ScoreRules::make(p, seq, batch, head);
  const bool row_valid = row < seq.seqlen_q;
  const float lse_log2 =
      row_valid ? lse_shift_log2(*p.lse.row<const float>(batch, head, seq.q_row0 + row)) : 0.f;
  const float dsum = row_valid ? d_gmem[query_row_index(p, seq, head, row)] : 0.f;
  const SimtRowBlock block(seq, QueryRows{1, head}, m_start, Traits::kNWarps);  // never packed
  const DropoutSeed dropout = dropout_seed(p.dropout);
  float dq[kCols] = {};
  for (int tile = block.tile_begin; tile < block.tile_end; ++tile) {
    const int n_start = tile * kWarpSize;
    const uint8_t mask_class = block.attn_mask(p, seq, batch, head, n_start);
    if (mask_class == kMaskHidden) continue;  // the whole CTA alike
    __syncthreads();
    load_rows_f32<Traits::kNThreads>(
        k_tile, k_gmem + n_start * p.k.row_stride, p.k.row_stride, seq.seqlen_k - n_start,
        p.head_dim);
    load_rows_f32<Traits::kNThreads>(
        v_tile, v_gmem + n_start * p.v.row_stride, p.v.row_stride, seq.seqlen_k - n_start,
        p.head_dim_v);
    __syncthreads();
    const int key = n_start + lane;
    const float s = dot_row<kHeadDim>(q_tile.at(warp, 0), k_tile.at(lane, 0));
    const float dp = dot_row<kHeadDim>(do_tile.at(warp, 0), v_tile.at(lane, 0));
    // Steps 1-6 and the chain rule (score_rules.cuh); rows past the sequence are never stored.
    const ScoreGrad g = rules.backward<false, false>(s, dp, row, key, ScoreTile{mask_class, true},
                                                     lse_log2, dsum, rules.kept(dropout, row, key));
    accumulate_rows<kCols>(dq, g.dlogit * g.dlogit_ds, k_tile, lane);
  }
  if (!row_valid) return;
  float* dq_row = GradRows::dq(p, seq, batch, head).row<float>(row);  // [D] (bwd_epilogue.cuh)
#pragma unroll
  for (int t = 0; t < kCols; ++t)
    if (lane + t * kWarpSize < p.head_dim) dq_row[lane + t * kWarpSize] = dq[t];
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, kSimtMinBlocksPerSm)
    simt_dkdv_kernel(const AttnBwdParams p, const float* d_gmem /* D_i, by query_row_index */) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStride = Traits::kSmemStride;
  constexpr int kCols = Traits::kColsPerLane;
  constexpr int kNThreads = Traits::kNThreads;
  if (!in_grid<TileAxis::kKeys>(p)) return;
  const auto work = work_tile<TileAxis::kKeys, Traits::kNWarps>(p);
  if (work.past_end()) return;
  const Sequence seq = work.seq;
  const int batch = work.batch, head_kv = work.head_kv, n_start = work.start;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int key = n_start + warp;

  FLASHATTN_DYNAMIC_SMEM(float, smem);
  auto& shared = *reinterpret_cast<typename Traits::KeyRowsStorage*>(smem);  // traits.h
  const SmemTile<Traits::kNWarps, kHeadDim, kStride, float> k_tile{shared.k};  // a key per warp
  const SmemTile<Traits::kNWarps, kHeadDim, kStride, float> v_tile{shared.v};
  const SmemTile<kWarpSize, kHeadDim, kStride, float> q_tile{shared.q};  // a query per lane
  const SmemTile<kWarpSize, kHeadDim, kStride, float> do_tile{shared.dout};
  float* lse_smem = shared.lse;    // [32] LSE_i in log2 units
  float* dsum_smem = shared.dsum;  // [32] D_i
  load_rows_f32<kNThreads>(
      k_tile, p.k.row<const float>(batch, head_kv, seq.k_row0 + n_start), p.k.row_stride,
      seq.seqlen_k - n_start, p.head_dim);
  load_rows_f32<kNThreads>(
      v_tile, p.v.row<const float>(batch, head_kv, seq.k_row0 + n_start), p.v.row_stride,
      seq.seqlen_k - n_start, p.head_dim_v);

  const int key_last = min(n_start + Traits::kNWarps, seq.seqlen_k) - 1;
  int row_begin, row_end;
  rows_seeing_keys(seq, n_start, key_last, row_begin, row_end);
  const int tile_begin = row_begin / kWarpSize;
  const int tiles = row_end > row_begin ? (row_end + kWarpSize - 1) / kWarpSize - tile_begin : 0;
  const DropoutSeed dropout = dropout_seed(p.dropout);
  float dk[kCols] = {}, dv[kCols] = {};
  for (int it = 0; it < tiles * p.head_group; ++it) {
    const int head = head_kv * p.head_group + it / tiles;
    const int m_start = (tile_begin + it % tiles) * kWarpSize;
    const int64_t d_row0 = query_row_index(p, seq, head, m_start);  // [32] of D
    const int64_t q_row0 = seq.q_row0 + m_start;
    const uint8_t mask_class = mask_tile(p.mask, batch, head, m_start,
                                         min(m_start + kWarpSize, seq.seqlen_q), n_start,
                                         key_last + 1);
    if (mask_class == kMaskHidden) continue;  // the whole CTA alike
    __syncthreads();  // every warp is done with the previous query tile
    load_rows_f32<kNThreads>(
        q_tile, p.q.row<const float>(batch, head, q_row0), p.q.row_stride,
        seq.seqlen_q - m_start, p.head_dim);
    load_rows_f32<kNThreads>(
        do_tile, p.dout.row<const float>(batch, head, q_row0), p.dout.row_stride,
        seq.seqlen_q - m_start, p.head_dim_v);
    for (int i = threadIdx.x; i < kWarpSize; i += kNThreads) {
      const bool valid = m_start + i < seq.seqlen_q;
      FLASHATTN_SMEM(lse_smem)[i] =
          valid ? lse_shift_log2(*p.lse.row<const float>(batch, head, q_row0 + i)) : 0.f;
      FLASHATTN_SMEM(dsum_smem)[i] = valid ? d_gmem[d_row0 + i] : 0.f;
    }
    __syncthreads();
    const ScoreRules rules = ScoreRules::make(p, seq, batch, head);
    const int query = m_start + lane;
    const float s = dot_row<kHeadDim>(q_tile.at(lane, 0), k_tile.at(warp, 0));
    const float dp = dot_row<kHeadDim>(do_tile.at(lane, 0), v_tile.at(warp, 0));
    // Steps 1-6 and the chain rule (score_rules.cuh); dK and dV sum over the query rows.
    const float kept = rules.kept(dropout, query, key);
    const ScoreGrad g = rules.backward<false, true>(
        s, dp, query, key, ScoreTile{mask_class, true}, FLASHATTN_SMEM(lse_smem)[lane],
        FLASHATTN_SMEM(dsum_smem)[lane], kept);
    if (p.dmask != nullptr && rules.in_sequence(query, key))
      p.dmask[((static_cast<int64_t>(batch) * p.heads_q + head) * p.seqlen_q + query) *
                  p.seqlen_k + key] = g.dlogit;
    accumulate_rows<kCols>(dv, g.prob * kept, do_tile, lane);
    accumulate_rows<kCols>(dk, g.dlogit * g.dlogit_ds, q_tile, lane);
  }
  if (key >= seq.seqlen_k) return;
  // Where the key's rows go (bwd_epilogue.cuh).
  float* dk_row = GradRows::dk(p, seq, batch, head_kv).row<float>(key);  // [D]
  float* dv_row = GradRows::dv(p, seq, batch, head_kv).row<float>(key);  // [Dv]
#pragma unroll
  for (int t = 0; t < kCols; ++t) {
    const int col = lane + t * kWarpSize;
    if (col < p.head_dim) dk_row[col] = dk[t];
    if (col < p.head_dim_v) dv_row[col] = dv[t];
  }
}

}  // namespace flashattn::cuda
