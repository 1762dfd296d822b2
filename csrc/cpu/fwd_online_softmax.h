// What the forward's two kernels (fwd_tile_kernel.h, fwd_decode_kernel.h) share between their
// two products: a tile's running state (FlashAttention-2's m_i, l_i, O_i, and the score tile)
// and the step that folds one key block's scores S_ij into it, after the score steps (scale,
// softcap, ALiBi, attn_mask, visibility), leaving P_ij for the product with V, dropped out
// where dropout is on.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "../mask.h"
#include "dropout_tile.h"
#include "dtype_dispatch.h"
#include "fwd_plan.h"
#include "score_rows.h"
#include "scratch_buffer.h"
#include "simd.h"
#include "softmax_vec.h"
#include "tiling.h"

namespace flashattn::cpu {

// How a product engine hands S_ij over and takes P_ij back.
enum class ScoreForm {
  // S_ij scaled already (the engine folded the scale into Qi); P_ij in place of S_ij, in the
  // compute type.
  kScaled,
  // S_ij unscaled (Qi kept in 16 bits); P_ij rounded to 16 bits into `probs16`, zero past the
  // block's keys up to kKeyBlock, as FlashAttention rounds P for P·V on GPUs.
  kUnscaled16,
};

// One worker's tile state, reused across its tasks, for tiles of up to tile_rows rows
// (ForwardPlan::tile_rows: a decode step's tiles hold a row or a GQA group, not 128).
template <typename In>
struct TileRows {
  using T = compute_t<In>;
  // out_stride: the row stride of O_i; probs16: room for P_ij in 16 bits (ScoreForm::kUnscaled16).
  TileRows(int tile_rows, int out_stride, bool probs16)
      : scores(size_t(tile_rows) * kKeyBlock),
        probs16(probs16 ? size_t(tile_rows) * kKeyBlock : 0),
        out_acc(size_t(tile_rows) * out_stride),
        row_max(tile_rows),
        row_sum(tile_rows),
        out_stride(out_stride) {}

  // Before a task's first key block: O_i = 0, m_i = -inf, l_i = 0.
  void reset(int tile_rows) {
    std::fill_n(out_acc.data(), size_t(tile_rows) * out_stride, T(0));
    std::fill_n(row_max.data(), tile_rows, -std::numeric_limits<T>::infinity());
    std::fill_n(row_sum.data(), tile_rows, T(0));
  }

  ScratchBuffer<T> scores;    // S_ij, then P_ij, row stride kKeyBlock
  ScratchBuffer<In> probs16;  // kUnscaled16: P_ij in 16 bits, row stride kKeyBlock
  ScratchBuffer<T> out_acc;   // O_i before division by l_i, row stride out_stride
  ScratchBuffer<T> row_max;   // m_i
  ScratchBuffer<T> row_sum;   // l_i
  int out_stride;
};

// One key block of a task: keys [key_begin, key_begin + cols) as its rows see them.
struct KeyBlockView {
  int key_begin, cols;
  TileVisibility visibility;
  uint8_t mask_class;  // attn_mask's class over all the tile's heads
};

// The view of key block kb for a task's tile of `heads` heads; skip() when nothing of it is
// seen.
inline KeyBlockView key_block_view(const AttnParams& p, const Sequence& seq,
                                   const ForwardTask& task, int heads, int kb) {
  KeyBlockView view;
  view.key_begin = kb * kKeyBlock;
  view.cols = std::min(kKeyBlock, seq.seqlen_k - view.key_begin);
  const int row_end = task.row_begin + task.rows, key_end = view.key_begin + view.cols;
  view.visibility = tile_visibility(seq, task.row_begin, row_end, view.key_begin, key_end);
  view.mask_class = mask_tile(p.mask, task.b, task.head0, task.row_begin, row_end,
                              view.key_begin, key_end);
  for (int g = 1; g < heads && view.mask_class != kMaskRead; ++g)
    if (mask_tile(p.mask, task.b, task.head0 + g, task.row_begin, row_end, view.key_begin,
                  key_end) != view.mask_class)
      view.mask_class = kMaskRead;
  return view;
}
inline bool nothing_seen(const KeyBlockView& view) {
  return view.visibility == TileVisibility::kNone || view.mask_class == kMaskHidden;
}

namespace fwd_softmax {

// online_softmax_tile in place: fp32 on `lanes` lanes, fp64 (gradcheck) in plain loops.
inline void in_place(RowLanes lanes, float* scores, int rows, int cols,
                     float* row_max, float* row_sum, float* out, int64_t out_ld, int dim) {
  online_softmax_tile(lanes, scores, rows, cols, kKeyBlock, row_max, row_sum, out, out_ld, dim);
}
inline void in_place(RowLanes, double* scores, int rows, int cols, double* row_max,
                     double* row_sum, double* out, int64_t out_ld, int dim) {
  online_softmax_tile(scores, rows, cols, kKeyBlock, row_max, row_sum, out, out_ld, dim);
}

}  // namespace fwd_softmax

// Folds a task's S_ij of key block `view` (in t.scores, as kForm says) into m_i, l_i and O_i
// (v_dim columns), and leaves P_ij (unnormalized) where kForm says. tile_rows = task.rows *
// heads rows, head-major.
template <ScoreForm kForm, typename In>
void online_softmax_step(const AttnParams& p, const Sequence& seq, const ForwardTask& task,
                         int heads, const KeyBlockView& view, int v_dim, RowLanes lanes,
                         TileRows<In>& t) {
  using T = compute_t<In>;
  constexpr bool kProbs16 = kForm == ScoreForm::kUnscaled16;
  const int rows = task.rows, tile_rows = rows * heads, cols = view.cols;
  const int key_begin = view.key_begin;
  // Without dropout, which drops from the fp32 P_ij, the 16-bit form's scale and rounding go
  // into the softmax's own pass over the tile (one pass instead of three).
  const bool fused_16bit = kProbs16 && !p.dropout.on();
  // The score rules (score_rows.h): the 16-bit products leave S_ij unscaled.
  const ScoreRows<T> rules(p, seq, task.b, /*scores_scaled=*/!kProbs16);
  const ScoreTile tile{view.visibility, view.mask_class};
  const bool row_steps = rules.has_row_steps(tile);
  if (row_steps || (kProbs16 && !fused_16bit))
    for (int r = 0; r < tile_rows; ++r) {
      const int row = task.row_begin + r % rows, h = task.head0 + r / rows;
      rules.logits(t.scores.data() + size_t(r) * kKeyBlock,
                   ScoreLine::of_row(h, row, key_begin, cols), tile);
    }
  if constexpr (kProbs16) {
    if (fused_16bit) {
      // Scaled above already when there were row steps.
      const float scale = row_steps ? 1.f : softmax_scale<T>(p);
      online_softmax_tile(lanes, t.scores.data(), tile_rows, cols, kKeyBlock, scale,
                          t.row_max.data(), t.row_sum.data(), t.out_acc.data(), t.out_stride,
                          v_dim, t.probs16.data(), kKeyBlock, kKeyBlock);
    }
  }
  if (!fused_16bit)
    fwd_softmax::in_place(lanes, t.scores.data(), tile_rows, cols, t.row_max.data(),
                          t.row_sum.data(), t.out_acc.data(), t.out_stride, v_dim);
  // Dropout drops from the product with V only: l_i above summed the whole P_ij.
  if (p.dropout.on())
    for (int g = 0; g < heads; ++g)
      rules.drop_rows(t.scores.data() + size_t(g) * rows * kKeyBlock, kKeyBlock, task.head0 + g,
                      task.row_begin, rows, key_begin, cols);
  if constexpr (kProbs16)
    for (int r = 0; r < tile_rows && !fused_16bit; ++r) {
      In* probs_row = t.probs16.data() + size_t(r) * kKeyBlock;
      round_to_16bit(t.scores.data() + size_t(r) * kKeyBlock, probs_row, cols);
      std::fill(probs_row + cols, probs_row + kKeyBlock, In(0.f));
    }
}

}  // namespace flashattn::cpu
