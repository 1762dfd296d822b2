// Where a forward task's finished rows go: out_i = O_i / l_i and lse_i = m_i + log(l_i) into
// out and lse, or, with split-KV, into the split's partial results, which merge() then combines
// by their LSEs. Shared by the tile and the decode kernel (fwd_tile_kernel.h,
// fwd_decode_kernel.h).
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../params.h"
#include "dtype_dispatch.h"
#include "fwd_online_softmax.h"
#include "fwd_plan.h"
#include "packing.h"
#include "task_queue.h"

namespace flashattn::cpu {

template <typename In>
class ForwardOutput {
  using T = compute_t<In>;

 public:
  ForwardOutput(const AttnParams& p, const std::vector<Sequence>& seqs, int splits)
      : p_(p), seqs_(seqs), splits_(splits), v_dim_(p.head_dim_v) {
    if (splits_ > 1) {
      const int64_t rows = int64_t(splits_) * p_.heads_q * p_.total_q;
      split_lse_ = alloc_workspace<T>(split_lse_storage_, rows);
      split_out_ = alloc_workspace<T>(split_out_storage_, rows * v_dim_);
    }
  }

  // The task's rows of its `heads` heads from its tile t (head-major, task.rows per head); a
  // row that saw no key gets 0 and -inf.
  void store(const ForwardTask& task, int heads, const TileRows<In>& t) const {
    for (int g = 0; g < heads; ++g) store_head(task, task.head0 + g, g * task.rows, t);
  }

  // out = sum_s w_s out_s / sum_s w_s with w_s = exp(lse_s - max lse), lse = max lse + log of
  // the weights' sum: the softmax over all keys, from the splits' softmaxes over theirs. An
  // empty split (lse -inf) weighs 0; a NaN anywhere makes the row NaN.
  void merge(int threads) const {
    if (splits_ <= 1) return;
    parallel_for_threads(int64_t(p_.batch) * p_.heads_q, threads, [&](int64_t begin, int64_t end) {
      std::vector<T> merged(v_dim_);
      for (int64_t bh = begin; bh < end; ++bh) {
        const int b = static_cast<int>(bh / p_.heads_q), h = static_cast<int>(bh % p_.heads_q);
        const Sequence& seq = seqs_[b];
        for (int row = 0; row < seq.seqlen_q; ++row) {
          T max_lse = -std::numeric_limits<T>::infinity();
          bool nan = false;
          for (int split = 0; split < splits_; ++split) {
            const T lse = split_lse_[split_row(split, seq, h, row)];
            nan |= std::isnan(lse);
            max_lse = std::max(max_lse, lse);
          }
          T weight_sum = 0;
          std::fill(merged.begin(), merged.end(), T(0));
          if (max_lse != -std::numeric_limits<T>::infinity())
            for (int split = 0; split < splits_; ++split) {
              const int64_t at = split_row(split, seq, h, row);
              const T weight = std::exp(split_lse_[at] - max_lse);
              if (weight == T(0)) continue;
              weight_sum += weight;
              for (int d = 0; d < v_dim_; ++d) merged[d] += weight * split_out_[at * v_dim_ + d];
            }
          const bool saw_keys = weight_sum > T(0);
          const T inv_sum = nan ? std::numeric_limits<T>::quiet_NaN()
                                : (saw_keys ? T(1) / weight_sum : T(0));
          store_out_row(b, h, seq.q_row0 + row, merged.data(), inv_sum);
          const T lse = nan ? std::numeric_limits<T>::quiet_NaN()
                            : (saw_keys ? max_lse + std::log(weight_sum)
                                        : -std::numeric_limits<T>::infinity());
          *p_.lse.row<float>(b, h, seq.q_row0 + row) = static_cast<float>(lse);
        }
      }
    });
  }

 private:
  // Head h's rows, tile rows [tile_row0, + task.rows).
  void store_head(const ForwardTask& task, int h, int tile_row0, const TileRows<In>& t) const {
    const Sequence& seq = seqs_[task.b];
    for (int r = 0; r < task.rows; ++r) {
      const int row = task.row_begin + r;
      const T sum = t.row_sum[tile_row0 + r];
      // sum is 0 only for a row that saw no key; a NaN sum (NaN inputs) goes on into out, lse.
      const bool saw_keys = !(sum == T(0));
      const T inv_sum = saw_keys ? T(1) / sum : T(0);
      const T lse = saw_keys ? t.row_max[tile_row0 + r] + std::log(sum)
                             : -std::numeric_limits<T>::infinity();
      const T* acc = t.out_acc.data() + size_t(tile_row0 + r) * t.out_stride;
      if (splits_ > 1) {
        const int64_t at = split_row(task.split, seq, h, row);
        split_lse_[at] = lse;
        for (int d = 0; d < v_dim_; ++d) split_out_[at * v_dim_ + d] = acc[d] * inv_sum;
        continue;
      }
      store_out_row(task.b, h, seq.q_row0 + row, acc, inv_sum);
      *p_.lse.row<float>(task.b, h, seq.q_row0 + row) = static_cast<float>(lse);
    }
  }

  // Output row `row` (of o's rows) of head h in batch b = values * inv_sum, rounded once to
  // out's type: In, or float32 when p_.out_fp32 (16-bit inputs; params.h).
  void store_out_row(int b, int h, int64_t row, const T* values, T inv_sum) const {
    if (p_.out_fp32) {
      float* out_row = p_.o.row<float>(b, h, row);
      for (int d = 0; d < v_dim_; ++d) out_row[d] = static_cast<float>(values[d] * inv_sum);
    } else {
      In* out_row = p_.o.row<In>(b, h, row);
      for (int d = 0; d < v_dim_; ++d) out_row[d] = static_cast<In>(values[d] * inv_sum);
    }
  }

  // Where split `split`'s partial result for query `row` of head h of a sequence is.
  int64_t split_row(int split, const Sequence& seq, int h, int row) const {
    return int64_t(split) * p_.heads_q * p_.total_q + query_row_index(p_, seq, h, row);
  }

  const AttnParams& p_;
  const std::vector<Sequence>& seqs_;
  const int splits_;
  const int v_dim_;  // of v and out (MLA: may differ from the head dim of q and k)
  // Split-KV partial results: lse [splits][heads_q * total_q], out [...][v_dim].
  at::Tensor split_lse_storage_, split_out_storage_;
  T* split_lse_ = nullptr;
  T* split_out_ = nullptr;
};

}  // namespace flashattn::cpu
