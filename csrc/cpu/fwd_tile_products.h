// The tile kernel's product engines (fwd_tile_kernel.h): how a key block's K and V become GEMM
// operands, how Qi is laid out, and the two products S_ij = Qi Kjᵀ and O_i += P_ij Vj. fwd.cpp
// builds one per call from the dtype and the CPU (run_on_operand_path, panels16.h):
//   ComputeTileProducts  the compute type (fp32, or fp64 for gradcheck): Kjᵀ packed, V read in
//                        place when it is in that type already, the softmax scale folded into Qi;
//   Native16TileProducts bf16/fp16 inputs kept in 16 bits (panels16.h) and multiplied with fp32
//                        accumulation, P_ij rounded to 16 bits for P·V, as FlashAttention does on
//                        GPUs. On AMX this is several times the fp32 rate; the scale is applied
//                        to each fp32 S_ij.
// Each is a type the kernel is instantiated with, so the products' calls are direct.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../kv_rows.h"
#include "../params.h"
#include "dtype_dispatch.h"
#include "fwd_online_softmax.h"
#include "fwd_plan.h"
#include "panels16.h"
#include "tile_gemm.h"

namespace flashattn::cpu {

// One key block's K and V operands, where the products read them: V with row stride values_ld.
template <typename Operand>
struct KvTile {
  const Operand* keys;
  const Operand* values;
  int64_t values_ld;
};

template <typename InT>
struct ComputeTileProducts {
  using In = InT;
  using T = compute_t<In>;
  using Operand = T;
  static constexpr ScoreForm kForm = ScoreForm::kScaled;

  explicit ComputeTileProducts(const AttnParams& p)
      : qk_dim(p.head_dim),
        v_dim(p.head_dim_v),
        q_stride(p.head_dim),
        out_stride(p.head_dim_v),
        // V in the compute type with rows that do not overlap (row stride >= head_dim_v, the
        // leading dimension brgemm accepts; an expanded V has stride 0) is read in place.
        values_in_place(keys_in_place(p.kv_cache) && std::is_same_v<In, T> &&
                        p.v.row_stride >= p.head_dim_v),
        scale(softmax_scale<T>(p)) {}

  // Kjᵀ [qk_dim][kKeyBlock] and (unless values_in_place) Vj [kKeyBlock][v_dim].
  int64_t key_block_elements() const { return int64_t(kKeyBlock) * qk_dim; }
  int64_t value_block_elements() const { return int64_t(kKeyBlock) * v_dim; }
  int64_t staging_elements() const { return 0; }

  // Row r of Qi, scaled.
  void load_query_row(const In* q_row, Operand* dst) const {
    for (int d = 0; d < qk_dim; ++d) dst[d] = static_cast<T>(q_row[d]) * scale;
  }

  // Key block kb of a sequence of seqlen_k keys, key j at key_of(j), value j at value_of(j).
  template <typename KeyOf, typename ValueOf>
  void load_kv_block(const KeyOf& key_of, const ValueOf& value_of, int seqlen_k, int kb,
                     Operand* keys, Operand* values, Operand* /*staging*/) const {
    const int key_begin = kb * kKeyBlock, cols = std::min(kKeyBlock, seqlen_k - key_begin);
    for (int c = 0; c < cols; ++c) {
      const In* key = key_of(key_begin + c);
      for (int d = 0; d < qk_dim; ++d) keys[size_t(d) * kKeyBlock + c] = static_cast<T>(key[d]);
      if (values_in_place) continue;
      const In* value = value_of(key_begin + c);
      T* v_out = values + size_t(c) * v_dim;
      for (int d = 0; d < v_dim; ++d) v_out[d] = static_cast<T>(value[d]);
    }
  }

  void multiply_q_kt(int rows, int cols, const Operand* q, const KvTile<Operand>& kv,
                     T* scores) const {
    tile_gemm(rows, cols, qk_dim, q, qk_dim, kv.keys, kKeyBlock, scores, kKeyBlock,
              /*accumulate=*/false);
  }

  void multiply_p_v(int rows, int cols, const KvTile<Operand>& kv, TileRows<In>& t) const {
    tile_gemm(rows, v_dim, cols, t.scores.data(), kKeyBlock, kv.values, kv.values_ld,
              t.out_acc.data(), out_stride, /*accumulate=*/true);
  }

  static constexpr bool vnni = false;
  const int qk_dim, v_dim;
  const int q_stride;    // of Qi's rows
  const int out_stride;  // of O_i's rows
  const bool values_in_place;
  const T scale;
};

template <typename InT>
struct Native16TileProducts {
  using In = InT;
  using T = float;
  using Operand = In;
  static constexpr ScoreForm kForm = ScoreForm::kUnscaled16;
  static_assert(std::is_same_v<In, c10::BFloat16> || std::is_same_v<In, c10::Half>);

  // vnni: the B panels are packed for the call's 16-bit kernel (tile_gemm.h).
  Native16TileProducts(const AttnParams& p, bool vnni)
      : vnni(vnni),
        qk_dim(p.head_dim),
        v_dim(p.head_dim_v),
        // The products run over whole zero-padded panels: K even, O_i in 64-wide panels.
        q_stride(round_up(p.head_dim, 2)),
        out_stride(round_up(p.head_dim_v, kPanelWidth)) {}

  // The block's key panels and value panels (panels16.h).
  int64_t key_block_elements() const { return int64_t(kKeyBlock) * q_stride; }
  int64_t value_block_elements() const { return int64_t(kKeyBlock) * out_stride; }
  // A row-major panel staged before VNNI packing.
  int64_t staging_elements() const { return int64_t(kKeyBlock) * std::max(q_stride, kPanelWidth); }

  // Row r of Qi as it is; a column padding qk_dim to even stays 0.
  void load_query_row(const In* q_row, Operand* dst) const { std::copy_n(q_row, qk_dim, dst); }

  template <typename KeyOf, typename ValueOf>
  void load_kv_block(const KeyOf& key_of, const ValueOf& value_of, int seqlen_k, int kb,
                     Operand* keys, Operand* values, Operand* staging) const {
    const int key_panels = kKeyBlock / kPanelWidth, key_panel = q_stride * kPanelWidth;
    for (int index = 0; index < key_panels; ++index)
      stream_panel(staging, keys + size_t(index) * key_panel, q_stride, [&](In* panel) {
        fill_key_panel(key_of, seqlen_k, qk_dim, kKeyBlock, kb, index, panel);
      });
    const int value_panel = kKeyBlock * kPanelWidth;
    for (int index = 0; index < out_stride / kPanelWidth; ++index)
      stream_panel(staging, values + size_t(index) * value_panel, kKeyBlock, [&](In* panel) {
        fill_value_panel(value_of, seqlen_k, v_dim, kKeyBlock, kb, index, panel);
      });
  }

  void multiply_q_kt(int rows, int cols, const Operand* q, const KvTile<Operand>& kv,
                     T* scores) const {
    for (int panel = 0; panel * kPanelWidth < cols; ++panel)
      tile_gemm(rows, kPanelWidth, q_stride, q, q_stride,
                kv.keys + size_t(panel) * q_stride * kPanelWidth, kPanelWidth,
                scores + panel * kPanelWidth, kKeyBlock, /*accumulate=*/false, vnni);
  }

  // Over the whole key block: P_ij and Vj are zero past the last key.
  void multiply_p_v(int rows, int /*cols*/, const KvTile<Operand>& kv, TileRows<In>& t) const {
    for (int panel = 0; panel < out_stride / kPanelWidth; ++panel)
      tile_gemm(rows, kPanelWidth, kKeyBlock, t.probs16.data(), kKeyBlock,
                kv.values + size_t(panel) * kKeyBlock * kPanelWidth, kPanelWidth,
                t.out_acc.data() + panel * kPanelWidth, out_stride, /*accumulate=*/true, vnni);
  }

  const bool vnni;
  const int qk_dim, v_dim;
  const int q_stride, out_stride;
  static constexpr bool values_in_place = false;

 private:
  // One zeroed panel of `rows` x kPanelWidth filled by fill(), VNNI-packed into `dst` where the
  // products take it so, else filled in place (build_panels' steps).
  template <typename Fill>
  void stream_panel(Operand* staging, Operand* dst, int rows, const Fill& fill) const {
    Operand* panel = vnni ? staging : dst;
    std::fill_n(panel, size_t(rows) * kPanelWidth, Operand(0.f));
    fill(panel);
    if (vnni) pack_vnni_panel(panel, dst, rows);
  }
};

}  // namespace flashattn::cpu
