// The decode kernel's product engines (fwd_decode_kernel.h): the two products of a tile of a
// few query rows per kv head, taking each key and value row where it is (row_products.h).
// fwd.cpp builds one per call from the dtype and the CPU:
//   Fp32RowProducts    fp32 sums on the CPU's vector width (row_lanes()), Qi in fp32 and
//                      scaled, P_ij in fp32: any input type, whatever multiplies the big tiles
//                      (on a Zen 4 the 16-bit path's panels made a bf16 decode step 4x slower);
//   Bf16DotRowProducts vdpbf16ps, where the call's 16-bit tile products run on it too
//                      (Gemm16Kernel::kAvx512Dot): Qi in bf16 and unscaled, P_ij rounded to
//                      bf16, as in those tile products.
// Each is a type the kernel is instantiated with, so the products' calls are direct.
#pragma once
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../params.h"
#include "dtype_dispatch.h"
#include "fwd_online_softmax.h"
#include "fwd_plan.h"
#include "panels16.h"
#include "row_products.h"
#include "row_stream.h"
#include "scratch_buffer.h"

namespace flashattn::cpu {

template <typename InT>
struct Fp32RowProducts {
  using In = InT;
  static constexpr ScoreForm kForm = ScoreForm::kScaled;

  Fp32RowProducts(const AttnParams& p, RowLanes lanes)
      : lanes(lanes), qk_dim(p.head_dim), v_dim(p.head_dim_v), scale(softmax_scale<float>(p)) {}

  // One worker's Qi: fp32 rows of stride qk_dim.
  struct Query {
    Query(int tile_rows, const Fp32RowProducts& products)
        : rows(size_t(tile_rows) * products.qk_dim) {}
    ScratchBuffer<float> rows;
  };

  // Row r of Qi, scaled.
  void load_query_row(const In* q_row, int r, Query& q) const {
    float* dst = q.rows.data() + size_t(r) * qk_dim;
    for (int d = 0; d < qk_dim; ++d) dst[d] = static_cast<float>(q_row[d]) * scale;
  }
  // After the rows: nothing more to lay out.
  void finish_query(int /*rows_per_head*/, int /*kv_heads*/, Query& /*q*/) const {}

  void multiply_q_kt(const Query& q, int rows_per_head, const RowStream<In>& keys,
                     float* scores) const {
    dot_key_rows(lanes, q.rows.data(), rows_per_head, qk_dim, keys, qk_dim, scores, kKeyBlock);
  }

  void multiply_p_v(int rows_per_head, const RowStream<In>& values, TileRows<In>& t) const {
    add_value_rows(lanes, t.scores.data(), rows_per_head, kKeyBlock, values, v_dim,
                   t.out_acc.data(), t.out_stride);
  }

  const RowLanes lanes;
  const int qk_dim, v_dim;
  const float scale;
};

struct Bf16DotRowProducts {
  using In = c10::BFloat16;
  static constexpr ScoreForm kForm = ScoreForm::kUnscaled16;

  explicit Bf16DotRowProducts(const AttnParams& p)
      : qk_dim(p.head_dim), v_dim(p.head_dim_v), q_stride(round_up(p.head_dim, 2)) {}

  // One worker's Qi: bf16 rows of stride q_stride, a zero after an odd qk_dim; and with enough
  // rows per kv head (takes_query_lanes), the same rows laid out in the lanes of a vector.
  struct Query {
    Query(int tile_rows, const Bf16DotRowProducts& products)
        : rows(size_t(tile_rows) * products.q_stride, In(0.f)) {}
    ScratchBuffer<In> rows;
    std::vector<int32_t> lanes;
  };

  // Row r of Qi as it is (the softmax step scales the scores).
  void load_query_row(const In* q_row, int r, Query& q) const {
    std::copy_n(q_row, qk_dim, q.rows.data() + size_t(r) * q_stride);
  }
  void finish_query(int rows_per_head, int kv_heads, Query& q) const {
    if (!takes_query_lanes(rows_per_head)) return;
    q.lanes.resize(query_lanes_size(kv_heads, qk_dim));
    lay_query_lanes_bf16(q.rows.data(), rows_per_head, kv_heads, q_stride, qk_dim,
                         q.lanes.data());
  }

  void multiply_q_kt(const Query& q, int rows_per_head, const RowStream<In>& keys,
                     float* scores) const {
    dot_key_rows_bf16({q.rows.data(), rows_per_head, q_stride,
                       takes_query_lanes(rows_per_head) ? q.lanes.data() : nullptr},
                      keys, qk_dim, scores, kKeyBlock);
  }

  void multiply_p_v(int rows_per_head, const RowStream<In>& values, TileRows<In>& t) const {
    add_value_rows_bf16(t.probs16.data(), rows_per_head, kKeyBlock, values, v_dim,
                        t.out_acc.data(), t.out_stride);
  }

  const int qk_dim, v_dim;
  const int q_stride;
};

}  // namespace flashattn::cpu
