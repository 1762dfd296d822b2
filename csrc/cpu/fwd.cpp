// Forward attention on CPU: FlashAttention-2's algorithm. Each task takes one block of query
// rows Qi of one head of one sequence and streams the visible key/value tiles Kj, Vj of that
// sequence past it, keeping only one score tile S_ij = Qi Kjᵀ, the running row maximum m_i and
// row sum l_i, and the unnormalized output accumulator O_i. Memory is O(S·D): nothing of size
// Sq x Sk is ever allocated. Blocks start at each sequence's first row, so in a varlen batch a
// sequence's result is bit for bit the dense op's on that sequence alone; the task queue runs
// the blocks of all sequences, heaviest first, so one long sequence among short ones still
// keeps every thread busy.
//
// The tile products take their operands in one of two forms (OperandPath):
//   kCompute  the compute type (fp32, or fp64 for gradcheck): Kjᵀ packed once, V read in place
//             when it is in that type already, the softmax scale folded into Qi;
//   kNative16 bf16/fp16 inputs kept in 16 bits (panels16.h) and multiplied with fp32
//             accumulation, P_ij rounded to 16 bits for P·V, as FlashAttention does on GPUs. On
//             AMX this is several times the fp32 rate; the scale is applied to each fp32 S_ij.
#include <cmath>
#include <limits>
#include <vector>

#include "dropout_tile.h"
#include "dtype_dispatch.h"
#include "kernels.h"
#include "packing.h"
#include "panels16.h"
#include "softmax_vec.h"
#include "task_queue.h"
#include "tile_gemm.h"
#include "tiling.h"

namespace flashattn::cpu {
namespace {

// Query rows per task and keys per tile. 128 x 128 beat 64 x 128, 256 x 128 and 128 x 256 on
// AVX2 in one-process A/B runs of the issue-5 shapes (2 threads: up to 10% faster than
// 64 x 128, causal most, never more than 3% slower): each Kj, Vj tile loaded into cache serves
// twice the rows. The tiles (scores 64 KB, Qi and O_i 32 KB each at d = 64, 64 KB at d = 128)
// stay in L2.
constexpr int kQueryBlock = 128;
constexpr int kKeyBlock = 128;

template <typename In, OperandPath kPath>
class ForwardKernel {
  using T = compute_t<In>;
  static constexpr bool kNative16 = kPath == OperandPath::kNative16;
  // The element type of the products' A and B operands.
  using Operand = std::conditional_t<kNative16, In, T>;

 public:
  ForwardKernel(const AttnParams& p, bool vnni)
      : p_(p),
        dim_(p.head_dim),
        // 16-bit products run over whole zero-padded panels: K even, O_i in 64-wide panels.
        gemm_dim_(kNative16 ? round_up(p.head_dim, 2) : p.head_dim),
        out_stride_(kNative16 ? round_up(p.head_dim, kPanelWidth) : p.head_dim),
        vnni_(vnni),
        seqs_(host_sequences(p)),
        values_in_place_(!kNative16 && std::is_same_v<In, T> && p.v.row_stride >= p.head_dim) {}

  void run() {
    const std::vector<QueryBlock> tasks = query_blocks();
    if (tasks.empty()) return;
    pack_keys_and_values();
    auto cost = [&](int64_t task) {
      const QueryBlock& t = tasks[task];
      const BlockRange keys =
          visible_key_blocks(seqs_[t.b], t.row_begin, t.row_begin + t.rows, kKeyBlock);
      return int64_t(keys.last - keys.first);
    };
    run_task_queue(int64_t(tasks.size()), cost, [&](const auto& claim) {
      Scratch scratch(gemm_dim_, out_stride_);
      for (int64_t task = claim(); task >= 0; task = claim())
        run_query_block(tasks[task], scratch);
      release_tile_gemm(vnni_);
    });
  }

 private:
  // A task: rows [row_begin, row_begin + rows) of sequence b, query head h.
  struct QueryBlock {
    int b, h, row_begin, rows;
  };

  std::vector<QueryBlock> query_blocks() const {
    std::vector<QueryBlock> tasks;
    for (int b = 0; b < p_.batch; ++b)
      for (int h = 0; h < p_.heads_q; ++h)
        for (int row = 0; row < seqs_[b].seqlen_q; row += kQueryBlock)
          tasks.push_back({b, h, row, std::min(kQueryBlock, seqs_[b].seqlen_q - row)});
    return tasks;
  }

  // One worker thread's tiles, reused across its tasks.
  struct Scratch {
    Scratch(int gemm_dim, int out_stride)
        : q_tile(size_t(kQueryBlock) * gemm_dim, Operand(0.f)),
          scores(size_t(kQueryBlock) * kKeyBlock),
          probs16(kNative16 ? size_t(kQueryBlock) * kKeyBlock : 0),
          out_acc(size_t(kQueryBlock) * out_stride),
          row_max(kQueryBlock),
          row_sum(kQueryBlock) {}
    std::vector<Operand> q_tile;  // Qi; scaled by the softmax scale on the kCompute path
    std::vector<T> scores;        // S_ij, then P_ij, row stride kKeyBlock
    std::vector<In> probs16;      // kNative16: P_ij in 16 bits, zero past the tile's keys
    std::vector<T> out_acc;       // O_i before division by l_i, row stride out_stride_
    std::vector<T> row_max;       // m_i
    std::vector<T> row_sum;       // l_i
  };

  void pack_keys_and_values() {
    const std::vector<SequenceRows> keys = key_rows(seqs_);
    if constexpr (kNative16) {
      k_panels16_ = pack_key_panels<In>(p_.k, keys, p_.heads_kv, dim_, kKeyBlock, vnni_);
      v_panels16_ = pack_value_panels<In>(p_.v, keys, p_.heads_kv, dim_, kKeyBlock, vnni_);
    } else {
      // Kj enters the score product transposed; Vj as it is, so only a V that needs converting
      // (or has overlapping rows) is copied.
      k_panels_ = pack_heads<T, In>(p_.k, keys, p_.heads_kv, dim_,
                                    PackLayout::kTransposedPanels, kKeyBlock, T(1));
      if (!values_in_place_)
        v_rows_ = pack_heads<T, In>(p_.v, keys, p_.heads_kv, dim_, PackLayout::kRows, kKeyBlock,
                                    T(1));
    }
  }

  void run_query_block(const QueryBlock& task, Scratch& s) {
    const int b = task.b, h = task.h, row_begin = task.row_begin, rows = task.rows;
    const Sequence& seq = seqs_[b];
    const int kv_head = h / p_.head_group;
    const T slope = alibi_slope(p_, b, h);

    for (int r = 0; r < rows; ++r) {
      const In* q_row = p_.q.row<const In>(b, h, seq.q_row0 + row_begin + r);
      Operand* tile_row = s.q_tile.data() + size_t(r) * gemm_dim_;
      if constexpr (kNative16)
        std::copy_n(q_row, dim_, tile_row);  // a column padding dim_ to even stays 0
      else
        for (int d = 0; d < dim_; ++d)
          tile_row[d] = static_cast<T>(q_row[d]) * softmax_scale<T>(p_);
    }
    std::fill(s.out_acc.begin(), s.out_acc.end(), T(0));
    std::fill(s.row_max.begin(), s.row_max.end(), -std::numeric_limits<T>::infinity());
    std::fill(s.row_sum.begin(), s.row_sum.end(), T(0));

    const BlockRange key_blocks = visible_key_blocks(seq, row_begin, row_begin + rows, kKeyBlock);
    for (int kb = key_blocks.first; kb < key_blocks.last; ++kb) {
      const int key_begin = kb * kKeyBlock;
      const int cols = std::min(kKeyBlock, seq.seqlen_k - key_begin);
      const TileVisibility visibility =
          tile_visibility(seq, row_begin, row_begin + rows, key_begin, key_begin + cols);
      const uint8_t mask_class =
          mask_tile(p_.mask, b, h, row_begin, row_begin + rows, key_begin, key_begin + cols);
      if (visibility == TileVisibility::kNone || mask_class == kMaskHidden) continue;
      multiply_q_kt(b, kv_head, kb, rows, cols, s);  // S_ij = scale · Qi Kjᵀ
      if (kNative16 || p_.softcap > 0 || p_.alibi.ptr || visibility == TileVisibility::kPartial ||
          mask_class == kMaskRead)
        for (int r = 0; r < rows; ++r) {
          T* score_row = s.scores.data() + size_t(r) * kKeyBlock;
          const int row = row_begin + r;
          if (kNative16) scale_by(score_row, cols, softmax_scale<T>(p_));
          if (p_.softcap > 0) apply_softcap(score_row, cols, softcap<T>(p_), nullptr);
          if (p_.alibi.ptr)
            add_alibi(score_row, cols, slope, row + seq.diag_offset - key_begin, -1);
          if (mask_class == kMaskRead) add_attn_mask(p_.mask, b, h, row, key_begin, score_row, cols);
          if (visibility == TileVisibility::kPartial)
            mask_row(seq, score_row, cols, row, key_begin);
        }
      // Folds S_ij into m_i, l_i and O_i, and turns it into P_ij (unnormalized).
      online_softmax_tile(s.scores.data(), rows, cols, kKeyBlock, s.row_max.data(),
                          s.row_sum.data(), s.out_acc.data(), out_stride_, dim_);
      // Dropout drops from the product with V only: l_i above summed the whole P_ij.
      if (p_.dropout.on())
        dropout_rows(p_.dropout, dropout_seed(p_.dropout), b, h, row_begin, rows, key_begin, cols,
                     s.scores.data(), kKeyBlock);
      if constexpr (kNative16)
        for (int r = 0; r < rows; ++r) {
          In* probs_row = s.probs16.data() + size_t(r) * kKeyBlock;
          round_to_16bit(s.scores.data() + size_t(r) * kKeyBlock, probs_row, cols);
          std::fill(probs_row + cols, probs_row + kKeyBlock, In(0.f));
        }
      multiply_p_v(b, kv_head, kb, rows, cols, s);  // O_i += P_ij Vj
    }
    store_output(b, h, seq.q_row0 + row_begin, rows, s);
  }

  // S_ij = scale · Qi Kjᵀ into s.scores (the kNative16 path applies the scale afterwards).
  void multiply_q_kt(int b, int kv_head, int kb, int rows, int cols, Scratch& s) const {
    if constexpr (kNative16) {
      for (int panel = 0; panel * kPanelWidth < cols; ++panel)
        tile_gemm(rows, kPanelWidth, gemm_dim_, s.q_tile.data(), gemm_dim_,
                  k_panels16_.panel(b, kv_head, kb, panel), kPanelWidth,
                  s.scores.data() + panel * kPanelWidth, kKeyBlock, /*accumulate=*/false, vnni_);
    } else {
      tile_gemm(rows, cols, dim_, s.q_tile.data(), dim_,
                k_panels_.head(b, kv_head) + int64_t(kb) * dim_ * kKeyBlock, kKeyBlock,
                s.scores.data(), kKeyBlock, /*accumulate=*/false);
    }
  }

  // O_i += P_ij Vj. The 16-bit product runs over the whole key block: P_ij and Vj are zero
  // past the last key.
  void multiply_p_v(int b, int kv_head, int kb, int rows, int cols, Scratch& s) const {
    if constexpr (kNative16) {
      for (int panel = 0; panel < v_panels16_.panels_per_block; ++panel)
        tile_gemm(rows, kPanelWidth, kKeyBlock, s.probs16.data(), kKeyBlock,
                  v_panels16_.panel(b, kv_head, kb, panel), kPanelWidth,
                  s.out_acc.data() + panel * kPanelWidth, out_stride_, /*accumulate=*/true,
                  vnni_);
    } else if (values_in_place_) {
      tile_gemm(rows, dim_, cols, s.scores.data(), kKeyBlock,
                p_.v.row<const T>(b, kv_head, seqs_[b].k_row0 + kb * kKeyBlock),
                p_.v.row_stride, s.out_acc.data(), dim_, /*accumulate=*/true);
    } else {
      tile_gemm(rows, dim_, cols, s.scores.data(), kKeyBlock,
                v_rows_.head(b, kv_head) + int64_t(kb) * kKeyBlock * dim_, dim_,
                s.out_acc.data(), dim_, /*accumulate=*/true);
    }
  }

  // Keys of the tile that `row` may not see become -inf.
  static void mask_row(const Sequence& seq, T* score_row, int cols, int row, int key_begin) {
    const int visible_begin = std::clamp(first_visible_key(seq, row) - key_begin, 0, cols);
    const int visible_end =
        std::clamp(visible_key_end(seq, row) - key_begin, visible_begin, cols);
    std::fill(score_row, score_row + visible_begin, -std::numeric_limits<T>::infinity());
    std::fill(score_row + visible_end, score_row + cols, -std::numeric_limits<T>::infinity());
  }

  // out_i = O_i / l_i and lse_i = m_i + log(l_i) for rows [row_begin, +rows) of the views; a
  // row that saw no key gets 0 and -inf.
  void store_output(int b, int h, int64_t row_begin, int rows, const Scratch& s) const {
    for (int r = 0; r < rows; ++r) {
      const T sum = s.row_sum[r];
      // sum is 0 only for a row that saw no key; a NaN sum (NaN inputs) goes on into out, lse.
      const bool saw_keys = !(sum == T(0));
      const T inv_sum = saw_keys ? T(1) / sum : T(0);
      const T* acc = s.out_acc.data() + size_t(r) * out_stride_;
      In* out_row = p_.o.row<In>(b, h, row_begin + r);
      for (int d = 0; d < dim_; ++d) out_row[d] = static_cast<In>(acc[d] * inv_sum);
      *p_.lse.row<float>(b, h, row_begin + r) =
          saw_keys ? static_cast<float>(s.row_max[r] + std::log(sum))
                   : -std::numeric_limits<float>::infinity();
    }
  }

  const AttnParams& p_;
  const int dim_;
  const int gemm_dim_;    // the K of the score product: dim_, or dim_ rounded up to even
  const int out_stride_;  // row stride of O_i: dim_, or dim_ rounded up to whole panels
  const bool vnni_;       // kNative16: B panels are VNNI-packed
  const std::vector<Sequence> seqs_;
  // V in the compute type with rows that do not overlap (row stride >= head_dim, the leading
  // dimension brgemm accepts; an expanded V has stride 0) is read in place.
  const bool values_in_place_;
  PackedHeads<T> k_panels_;  // kCompute operands
  PackedHeads<T> v_rows_;    // unless values_in_place_
  Panels16<In> k_panels16_;  // kNative16 operands (unused on the kCompute path)
  Panels16<In> v_panels16_;
};

}  // namespace

void run_fwd(const AttnParams& p, c10::ScalarType dtype) {
  run_on_operand_path<ForwardKernel>(p, dtype);
}

}  // namespace flashattn::cpu
