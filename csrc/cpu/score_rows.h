// The score pipeline (../score_rules.h) in the CPU's row form: its steps on a line of a score
// tile, one query row over a span of keys (the forward's tiles) or one key over a span of query
// rows (the backward's transposed tiles), and the backward's per-entry steps over a whole tile.
// Both CPU kernels take their scores through it: the forward's online softmax
// (fwd_online_softmax.h) and the backward (bwd.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "../score_rules.h"
#include "dropout_tile.h"
#include "dtype_dispatch.h"
#include "softmax_vec.h"
#include "tiling.h"

namespace flashattn::cpu {

// n entries of a score tile, contiguous, from (row, key) of query head `head`: along the keys
// (a row of the forward's tiles) or along the query rows (a row of the backward's, a key
// across its queries).
struct ScoreLine {
  bool along_keys;
  int head, row, key, n;

  static ScoreLine of_row(int head, int row, int key_begin, int n) {
    return {true, head, row, key_begin, n};
  }
  static ScoreLine of_key(int head, int key, int row_begin, int n) {
    return {false, head, row_begin, key, n};
  }
};

// What masks a tile of scores: the visibility of its keys (window, causal band, sequence) and
// attn_mask's class (kMaskHidden / kMaskOpen / kMaskRead, score_bias.h mask_tile).
struct ScoreTile {
  TileVisibility visibility;
  uint8_t mask_class;

  // Whether no entry of the tile is seen: it is skipped.
  bool hidden() const {
    return visibility == TileVisibility::kNone || mask_class == kMaskHidden;
  }
};

// The rules of one call on one sequence (batch entry `batch`), in the compute type T.
template <typename T>
class ScoreRows {
 public:
  // scores_scaled: the product folded the scale into its scores (the compute-type operands);
  // else step 1 runs here (the 16-bit products).
  ScoreRows(const AttnParams& p, const Sequence& seq, int batch, bool scores_scaled)
      : p_(p), seq_(seq), batch_(batch), scores_scaled_(scores_scaled) {}

  // Whether steps 2-5 change any entry of `tile`; if not, its logits are its scaled scores.
  bool has_row_steps(const ScoreTile& tile) const {
    return p_.softcap > 0 || p_.alibi.ptr || tile.visibility == TileVisibility::kPartial ||
           tile.mask_class == kMaskRead;
  }

  // Steps 1-5 on `line` of `tile`, in place: scores -> logits, -inf where hidden. With the
  // softcap, tanh_out (n entries, or null) gets tanh(scale s / softcap) for dscores().
  void logits(T* x, const ScoreLine& line, const ScoreTile& tile, T* tanh_out = nullptr) const {
    const int n = line.n;
    if (!scores_scaled_) scale_by(x, n, softmax_scale<T>(p_));
    if (p_.softcap > 0) apply_softcap(x, n, softcap<T>(p_), tanh_out);
    if (p_.alibi.ptr) {
      // |i + diag_offset - j| along the line: j grows along a row, i along a key.
      const int first_distance = line.row + seq_.diag_offset - line.key;
      add_alibi(x, n, T(alibi_slope(p_, batch_, line.head)), first_distance,
                line.along_keys ? -1 : 1);
    }
    if (tile.mask_class == kMaskRead) {
      // One loop per axis: strides multiplied per entry slowed the mask's hot loop.
      const AttnMask& m = p_.mask;
      const int b = batch_, h = line.head, row = line.row, key = line.key;
      if (line.along_keys)
        for (int i = 0; i < n; ++i) x[i] += mask_bias<T>(m, b, h, row, key + i);
      else
        for (int i = 0; i < n; ++i) x[i] += mask_bias<T>(m, b, h, row + i, key);
    }
    if (tile.visibility == TileVisibility::kPartial) hide_unseen(x, line);
  }

  // ---- step 6, the forward ----

  // Drops `rows` rows of P_ij in place (row stride ld): rows [row_begin, +rows) of head `head`
  // x keys [key_begin, +cols); kept ones are scaled by 1 / (1 - p).
  void drop_rows(T* tile, int ld, int head, int row_begin, int rows, int key_begin,
                 int cols) const {
    dropout_rows(p_.dropout, dropout_seed(p_.dropout), seq_.whole_batch,
                 seq_.head_offset + head, seq_.row_offset + row_begin, rows,
                 seq_.key_offset + key_begin, cols, tile, ld);
  }

  // ---- the backward, on its transposed tiles: `keys` lines of `rows` queries, stride ld ----

  // P_ij = exp(logit_ij - lse_i), lse_shift[r] the shift of query row_begin + r (+inf for a
  // row that saw no key, which makes its P 0).
  void to_probs(T* tile, int keys, int rows, int64_t ld, const T* lse_shift) const {
    exp_shifted_by_tile(tile, keys, rows, ld, lse_shift);
  }

  // Step 6's decisions Z_ij for queries [row_begin, +rows) x keys [key_begin, +keys) of head
  // `head`, into keep[key][query] (stride ld); the backward multiplies P and dP by them.
  void keeps(uint8_t* keep, int ld, int head, int row_begin, int rows, int key_begin,
             int keys) const {
    dropout_keeps_transposed(p_.dropout, dropout_seed(p_.dropout), seq_.whole_batch,
                             seq_.head_offset + head, seq_.row_offset + row_begin, rows,
                             seq_.key_offset + key_begin, keys, keep, ld);
  }
  // tile = Z tile / (1 - p), by keeps()'s decisions.
  void drop(const uint8_t* keep, T* tile, int keys, int rows, int ld) const {
    apply_keeps(keep, tile, keys, rows, ld, keep_scale<T>(p_.dropout));
  }

  // dP_ij -> dlogit_ij = P_ij (dP_ij Z_ij / (1 - p) - D_i) in place; keep: keeps()'s
  // decisions (read only with dropout); d_terms[r]: D of query row_begin + r.
  void dlogits(T* grads, const T* probs, const uint8_t* keep, int keys, int rows, int ld,
               const T* d_terms) const {
    if (p_.dropout.on()) drop(keep, grads, keys, rows, ld);
    softmax_grad_tile(grads, probs, keys, rows, ld, d_terms);
  }

  // dlogit_ij -> dS_ij / scale in place: times d logit / ds without its factor `scale`, which
  // the backward applies to dK and dQ when it stores them. tanh: logits()'s tanh_out.
  void dscores(T* grads, const T* tanh, int keys, int rows, int64_t ld) const {
    if (p_.softcap > 0)
      for (int c = 0; c < keys; ++c) mul_softcap_grad(grads + c * ld, tanh + c * ld, rows);
  }

 private:
  // Step 5 on a line of a partly visible tile: entries whose row does not see its key -> -inf.
  void hide_unseen(T* x, const ScoreLine& line) const {
    constexpr T kHidden = -std::numeric_limits<T>::infinity();
    if (line.along_keys) {
      // A row sees one range of keys.
      const int begin = std::clamp(first_visible_key(seq_, line.row) - line.key, 0, line.n);
      const int end = std::clamp(visible_key_end(seq_, line.row) - line.key, begin, line.n);
      std::fill(x, x + begin, kHidden);
      std::fill(x + end, x + line.n, kHidden);
    } else {
      for (int i = 0; i < line.n; ++i)
        if (!key_visible(seq_, line.row + i, line.key)) x[i] = kHidden;
    }
  }

  const AttnParams& p_;
  const Sequence& seq_;
  const int batch_;
  const bool scores_scaled_;
};

}  // namespace flashattn::cpu
